// Resolution of expressions just before a node starts (API.md §6.2), against
// the scope of §6.1. The scope is never built as a document: each `$ref` walks
// from the job's input or one node's record straight to the value it names, so
// reading from a large result shares its storage instead of copying it.

/// The scope a node reads: the job's input and the records of its nodes.
struct ExpressionScope {
    var input: JSONValue?
    var graph: JobGraph
    var nodes: [NodeRecord]
    /// The map copy the reading node belongs to: its `/item`, `/index` and template ids (API.md §7.1).
    var copy: MapCopy? = nil
}

/// Evaluates templates against a scope; every failure is a `NodeError` of kind `ref_unresolved`, `ref_type` or
/// `invalid_url`, without its `node` (the engine fills it in).
enum ExpressionResolver {
    /// The value a `$ref` names, or its `default`.
    static func lookup(_ ref: ScopeRef, in scope: ExpressionScope) -> Result<JSONValue, NodeError> {
        switch find(ref.pointer, in: scope) {
        case .success(let value):
            return .success(value)
        case .failure(let miss):
            if let fallback = ref.defaultValue { return .success(fallback) }
            let token = ref.pointer.tokens.indices.contains(miss.tokenIndex) ? ref.pointer.tokens[miss.tokenIndex] : ""
            return .failure(
                NodeError(
                    .refUnresolved,
                    "$ref \"\(ref.pointer.text)\" found nothing: segment \"\(token)\" is missing (\(miss.reason))"))
        }
    }

    private static func find(_ pointer: JSONPointerPath, in scope: ExpressionScope) -> Result<JSONValue, PointerMiss> {
        let tokens = pointer.tokens
        switch tokens.first {
        case "input":
            guard let input = scope.input else {
                return .failure(PointerMiss(tokenIndex: 0, reason: "the job has no input"))
            }
            return input.value(at: tokens[1...], fullTokens: tokens)
        case "item":
            guard let copy = scope.copy else {
                return .failure(PointerMiss(tokenIndex: 0, reason: "this node is not inside a map template"))
            }
            return copy.item.value(at: tokens[1...], fullTokens: tokens)
        case "index":
            guard let copy = scope.copy else {
                return .failure(PointerMiss(tokenIndex: 0, reason: "this node is not inside a map template"))
            }
            return JSONValue.int(copy.index).value(at: tokens[1...], fullTokens: tokens)
        case "nodes" where tokens.count >= 2:
            // Inside a copy, a template node's id names that node in the same copy.
            let id = scope.copy?.copyID(of: tokens[1]) ?? tokens[1]
            guard let j = scope.graph.index(ofNodeID: id), scope.nodes.indices.contains(j) else {
                return .failure(PointerMiss(tokenIndex: 1, reason: "the job has no node \"\(tokens[1])\""))
            }
            let record = scope.nodes[j]
            guard tokens.count >= 3 else { return .success(nodeObject(record)) }
            // Spelled out: a bare `nil` could be read as JSON null, which JSONValue takes as a literal.
            var field = Optional<JSONValue>.none
            switch tokens[2] {
            case "state": field = .some(.string(record.state.rawValue))
            case "result" where record.state == .succeeded: field = .some(record.result ?? .null)
            case "error": field = record.error?.json
            case "status": field = record.status.map { JSONValue.int($0) }
            default: break
            }
            guard let field else {
                let why: String
                switch tokens[2] {
                case "result": why = "node \"\(record.id)\" has no result: it ended \(record.state.rawValue)"
                case "error": why = "node \"\(record.id)\" has no error: it ended \(record.state.rawValue)"
                case "status": why = "node \"\(record.id)\" has no status"
                default: why = "a node has only state, result, error and status"
                }
                return .failure(PointerMiss(tokenIndex: 2, reason: why))
            }
            return field.value(at: tokens[3...], fullTokens: tokens)
        default:
            return .failure(PointerMiss(tokenIndex: 0, reason: "the scope has only input and nodes"))
        }
    }

    /// `{"state", "result", "error", "status"}` of a node, each present only when the node has it.
    static func nodeObject(_ record: NodeRecord) -> JSONValue {
        var members = [JSONMember("state", .string(record.state.rawValue))]
        if record.state == .succeeded { members.append(JSONMember("result", record.result ?? .null)) }
        if let error = record.error { members.append(JSONMember("error", error.json)) }
        if let status = record.status { members.append(JSONMember("status", .int(status))) }
        return .object(members)
    }

    /// A scalar's text where a string is needed: strings unquoted, numbers as written, booleans as JSON.
    static func text(of value: JSONValue) -> String? {
        switch value {
        case .string(let s): return s
        case .number(let n): return n
        case .bool(let b): return b ? "true" : "false"
        default: return nil
        }
    }

    /// A string template's value; `encode` percent-encodes each referenced part as one URI component.
    static func string(_ template: StringTemplate, in scope: ExpressionScope, place: String, encode: Bool = false)
        -> Result<String, NodeError>
    {
        var out = ""
        for part in template.parts {
            switch part {
            case .text(let s):
                out += s
            case .ref(let ref):
                switch lookup(ref, in: scope) {
                case .failure(let error):
                    return .failure(error)
                case .success(let value):
                    guard let text = text(of: value) else {
                        return .failure(
                            NodeError(
                                .refType,
                                "$ref \"\(ref.pointer.text)\" in \(place) must be a string, number or boolean, not "
                                    + article(value)))
                    }
                    out += encode ? percentEncode(text) : text
                }
            }
        }
        return .success(out)
    }

    /// A value template's value: whole-value `$ref`s insert what they find as it is.
    static func value(_ template: ValueTemplate, in scope: ExpressionScope, place: String) -> Result<JSONValue, NodeError> {
        switch template {
        case .value(let v):
            return .success(v)
        case .ref(let ref):
            return lookup(ref, in: scope)
        case .concat(let parts):
            return string(parts, in: scope, place: "a $concat in \(place)").map(JSONValue.string)
        case .array(let elements):
            var out: [JSONValue] = []
            out.reserveCapacity(elements.count)
            for element in elements {
                switch value(element, in: scope, place: place) {
                case .success(let v): out.append(v)
                case .failure(let error): return .failure(error)
                }
            }
            return .success(.array(out))
        case .object(let members):
            var out: [JSONMember] = []
            out.reserveCapacity(members.count)
            for member in members {
                switch value(member.value, in: scope, place: place) {
                case .success(let v): out.append(JSONMember(member.key, v))
                case .failure(let error): return .failure(error)
                }
            }
            return .success(.object(out))
        }
    }

    /// The request a fetch sends: `base` with its url, headers, query and body built from the scope.
    static func request(_ base: FetchRequest, _ flow: NodeDataflow, in scope: ExpressionScope)
        -> Result<FetchRequest, NodeError>
    {
        var request = base
        do {
            if let url = flow.url {
                request.url = try string(url, in: scope, place: "url", encode: true).get()
            }
            if let headers = flow.headers {
                var resolved: [(name: String, value: String)] = []
                for header in headers {
                    let value = try string(header.value, in: scope, place: "header \(header.name)").get()
                    if value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }) {
                        throw NodeError(.refType, "header \(header.name): its value contains CR, LF or NUL")
                    }
                    resolved.append((header.name, value))
                }
                request.headers = resolved
            }
            if !flow.query.isEmpty {
                var pairs: [(String, String)] = []
                for parameter in flow.query {
                    pairs.append((parameter.name, try string(parameter.value, in: scope, place: "query \(parameter.name)").get()))
                }
                request.url = appendQuery(to: request.url, pairs)
            }
            if let body = flow.body {
                request.body = .text(try string(body, in: scope, place: "body").get())
            }
            if let json = flow.json {
                request.body = .json(try value(json, in: scope, place: "json").get())
            }
        } catch let error as NodeError {
            return .failure(error)
        } catch {
            return .failure(NodeError(.internal, String(describing: error)))
        }
        if flow.url != nil || !flow.query.isEmpty,
            let problem = URLCheck.problem(request.url, maxBytes: Limits.maxURLBytes)
        {
            return .failure(NodeError(.invalidURL, "url \"\(clip(request.url))\" (as resolved): \(problem)"))
        }
        return .success(request)
    }

    /// A node's result narrowed by its `select`.
    static func select(_ path: JSONPointerPath, from result: JSONValue) -> Result<JSONValue, NodeError> {
        switch result.value(at: path.tokens[...], fullTokens: path.tokens) {
        case .success(let value):
            return .success(value)
        case .failure(let miss):
            let token = path.tokens.indices.contains(miss.tokenIndex) ? path.tokens[miss.tokenIndex] : ""
            return .failure(
                NodeError(
                    .refUnresolved,
                    "select \"\(path.text)\" found nothing in the result: segment \"\(token)\" is missing "
                        + "(\(miss.reason))"))
        }
    }

    // MARK: - URLs

    /// `s` as one URI component: RFC 3986 unreserved characters kept, every other byte of its UTF-8 as `%XX`.
    static func percentEncode(_ s: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count)
        for c in s.utf8 {
            let unreserved =
                (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || (c >= 0x30 && c <= 0x39) || c == 0x2D
                || c == 0x2E || c == 0x5F || c == 0x7E
            if unreserved {
                out.append(c)
            } else {
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(c >> 4)])
                out.append(hex[Int(c & 0xF)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `url` with `name=value` pairs added to its query, each encoded, in order, before any fragment.
    static func appendQuery(to url: String, _ pairs: [(String, String)]) -> String {
        guard !pairs.isEmpty else { return url }
        let encoded = pairs.map { percentEncode($0.0) + "=" + percentEncode($0.1) }.joined(separator: "&")
        var head = Substring(url)
        var fragment = Substring("")
        if let hash = url.firstIndex(of: "#") {
            head = url[..<hash]
            fragment = url[hash...]
        }
        let separator: String
        if !head.contains("?") {
            separator = "?"
        } else if head.hasSuffix("?") || head.hasSuffix("&") {
            separator = ""
        } else {
            separator = "&"
        }
        return head + separator + encoded + fragment
    }

    private static func clip(_ s: String) -> String {
        s.utf8.count <= 200 ? s : String(decoding: s.utf8.prefix(200), as: UTF8.self) + "…"
    }
}
