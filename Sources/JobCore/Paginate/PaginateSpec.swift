// Submit-time reading of a fetch's `paginate` (API.md §7.2).
//
// Decisions where API.md is silent:
// - `paginate` is for `GET` and `HEAD` only; on any other method it is refused
//   at `/paginate` (a page must be safe to fetch again after a restart).
// - `next` is `"link"` or an object with exactly one of `url`, `cursor`,
//   `page`. `cursor` takes `param` (default `"cursor"`); `page` names the
//   parameter (non-empty) and takes `start` (default 1, 0 to 1,000,000,000).
// - `next: {"page": …}` needs `items`: an empty page is its only way to stop
//   before `max_pages`.
// - With `items`, an empty items array stops paging for every `next` kind.
// - Pointers (`items`, `url`, `cursor`) are RFC 6901 and point into each
//   page's result (`{"status", "headers", "body", …}`), e.g. `/body/items`.

/// How a paginated fetch finds its next page.
public enum PaginateNext: Equatable, Sendable {
    /// The `Link` header's `rel="next"` target (RFC 8288).
    case link
    /// The URL at a pointer into the page's result, absolute or relative to the page.
    case url(JSONPointerPath)
    /// The value at a pointer into the page's result, set as query parameter `param` of the first URL.
    case cursor(JSONPointerPath, param: String)
    /// Query parameter `param` of the first URL, counted up from `start`.
    case page(param: String, start: Int)

    /// The kind's name in messages.
    var name: String {
        switch self {
        case .link: return "link"
        case .url: return "url"
        case .cursor: return "cursor"
        case .page: return "page"
        }
    }
}

/// A fetch's validated `paginate` object.
public struct PaginateSpec: Equatable, Sendable {
    public static let defaultMaxPages = 100
    public static let maxPagesCeiling = 1000
    public static let maxStart = 1_000_000_000
    static let fields: Set<String> = ["next", "items", "max_pages", "same_origin"]

    public var next: PaginateNext
    /// Where each page's items are; `nil` keeps every page's whole result.
    public var items: JSONPointerPath?
    public var maxPages: Int
    /// A next URL on another origin than the first URL's fails the node with kind `cross_origin`.
    public var sameOrigin: Bool

    public init(next: PaginateNext, items: JSONPointerPath? = nil, maxPages: Int = PaginateSpec.defaultMaxPages,
                sameOrigin: Bool = true) {
        self.next = next
        self.items = items
        self.maxPages = maxPages
        self.sameOrigin = sameOrigin
    }

    /// Reads `value`, the `paginate` member at `pointer` (document position `key`) of a fetch using `method`.
    /// - Returns: the spec, or `nil` with at least one issue.
    static func parse(_ value: JSONValue, pointer: String, key: [Int], method: String) -> (PaginateSpec?, [KeyedIssue]) {
        var issues: [KeyedIssue] = []
        func issue(_ pointer: String, _ message: String, _ key: [Int]) {
            issues.append(KeyedIssue(pointer: pointer, message: message, key: key))
        }
        guard case .object(let members) = value else {
            issue(pointer, "must be an object with next and optionally items, max_pages, same_origin, not \(article(value))", key)
            return (nil, issues)
        }
        let upper = method.uppercased()
        if upper != "GET" && upper != "HEAD" {
            issue(pointer, "paginate is only for GET and HEAD fetches, not \(method)", key)
        }
        var next: PaginateNext?
        var nextSpot: (String, [Int])?
        var items: JSONPointerPath?
        var maxPages = defaultMaxPages
        var sameOrigin = true
        var seen = Set<String>()
        for (position, member) in members.enumerated() {
            let here = pointer + "/" + JSONPointer.escape(member.key)
            let hereKey = key + [position]
            guard seen.insert(member.key).inserted else {
                issue(here, "duplicate field", hereKey)
                continue
            }
            switch member.key {
            case "next":
                nextSpot = (here, hereKey)
                next = parseNext(member.value, here, hereKey, issue)
            case "items":
                if let text = member.value.stringValue, let path = JSONPointerPath(text) {
                    items = path
                } else {
                    issue(here, "must be a JSON Pointer (RFC 6901) into each page's result, such as \"/body/items\"", hereKey)
                }
            case "max_pages":
                if let n = member.value.intValue, (1...maxPagesCeiling).contains(n) {
                    maxPages = n
                } else {
                    issue(here, "must be an integer from 1 to \(maxPagesCeiling)", hereKey)
                }
            case "same_origin":
                if let b = member.value.boolValue {
                    sameOrigin = b
                } else {
                    issue(here, "must be a boolean, not \(article(member.value))", hereKey)
                }
            default:
                issue(here, "unknown field (paginate takes next, items, max_pages, same_origin)", hereKey)
            }
        }
        if !seen.contains("next") {
            issue(pointer + "/next", "is required: \"link\", {\"url\": P}, {\"cursor\": P} or {\"page\": name}", key + [members.count])
        }
        if case .page? = next, items == nil, let (where_, whereKey) = nextSpot {
            issue(where_, "next by page number needs items: an empty page is what ends the paging", whereKey)
        }
        guard issues.isEmpty, let next else { return (nil, issues) }
        return (PaginateSpec(next: next, items: items, maxPages: maxPages, sameOrigin: sameOrigin), [])
    }

    private static func parseNext(
        _ value: JSONValue, _ pointer: String, _ key: [Int], _ issue: (String, String, [Int]) -> Void
    ) -> PaginateNext? {
        let kinds = "\"link\", {\"url\": P}, {\"cursor\": P, \"param\": name} or {\"page\": name, \"start\": n}"
        if let text = value.stringValue {
            if text == "link" { return .link }
            issue(pointer, "unknown next kind \"\(text)\": must be \(kinds)", key)
            return nil
        }
        guard case .object(let members) = value else {
            issue(pointer, "must be \(kinds), not \(article(value))", key)
            return nil
        }
        let kindNames = members.map(\.key).filter { $0 == "url" || $0 == "cursor" || $0 == "page" }
        guard kindNames.count == 1, let kind = kindNames.first else {
            issue(pointer, kindNames.isEmpty ? "unknown next kind: must be \(kinds)" : "must have exactly one of url, cursor, page", key)
            return nil
        }
        let allowed: Set<String> = kind == "url" ? ["url"] : kind == "cursor" ? ["cursor", "param"] : ["page", "start"]
        var pointerValue: JSONPointerPath?
        var param = kind == "cursor" ? "cursor" : ""
        var start = 1
        var ok = true
        for (position, member) in members.enumerated() {
            let here = pointer + "/" + JSONPointer.escape(member.key)
            let hereKey = key + [position]
            guard allowed.contains(member.key) else {
                issue(here, "unknown field in next \(kind) (it takes \(allowed.sorted().joined(separator: ", ")))", hereKey)
                ok = false
                continue
            }
            switch member.key {
            case "url", "cursor":
                if let text = member.value.stringValue, let path = JSONPointerPath(text) {
                    pointerValue = path
                } else {
                    issue(here, "must be a JSON Pointer (RFC 6901) into each page's result, such as \"/body/next\"", hereKey)
                    ok = false
                }
            case "param", "page":
                if let text = member.value.stringValue, !text.isEmpty {
                    param = text
                } else {
                    issue(here, "must be a query parameter name (a non-empty string)", hereKey)
                    ok = false
                }
            case "start":
                if let n = member.value.intValue, (0...maxStart).contains(n) {
                    start = n
                } else {
                    issue(here, "must be an integer from 0 to \(maxStart)", hereKey)
                    ok = false
                }
            default:
                break
            }
        }
        guard ok else { return nil }
        switch kind {
        case "url": return pointerValue.map { .url($0) }
        case "cursor": return pointerValue.map { .cursor($0, param: param) }
        default: return .page(param: param, start: start)
        }
    }
}
