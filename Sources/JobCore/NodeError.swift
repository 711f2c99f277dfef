/// The kinds of failure a node or job can end with (API.md §1.3).
public enum ErrorKind: String, Sendable, CaseIterable {
    case httpStatus = "http_status"
    case timeout
    case connect
    case dns
    case tls
    case tooLarge = "too_large"
    case tooManyRedirects = "too_many_redirects"
    case resourceExhausted = "resource_exhausted"
    case invalidJSON = "invalid_json"
    case cancelled
    case allFailed = "all_failed"
    case interrupted
    case `internal`
    /// A `$ref` or `select` found nothing and had no `default` (API.md §6.2).
    case refUnresolved = "ref_unresolved"
    /// A referenced value of the wrong type where a string is needed, or a header value with CR, LF or NUL.
    case refType = "ref_type"
    /// A url built from references is not an absolute http or https URL.
    case invalidURL = "invalid_url"
    /// A paginated fetch's next URL is on another origin than its first, and `same_origin` is true (API.md §7.2).
    case crossOrigin = "cross_origin"
    /// A map's items were more than its `max_items`, or than `--max-nodes` still allows (API.md §7.1).
    case tooManyItems = "too_many_items"
    /// More of a map's copies failed than its `tolerated_failures`.
    case tooManyFailures = "too_many_failures"
}

/// A node's or job's failure, as clients see it:
/// `{"kind": …, "message": …, "node": …, "status": …, "errors": […]}`.
public struct NodeError: Error, Equatable, Sendable, CustomStringConvertible {
    public var kind: ErrorKind
    public var message: String
    /// The id of the node that failed first; filled in by the engine.
    public var node: String?
    /// The HTTP status, for `http_status`.
    public var status: Int?
    /// Each child's error in child order, for `all_failed`.
    public var errors: [NodeError]?

    public init(_ kind: ErrorKind, _ message: String, node: String? = nil, status: Int? = nil, errors: [NodeError]? = nil) {
        self.kind = kind
        self.message = message
        self.node = node
        self.status = status
        self.errors = errors
    }

    public var description: String { "\(kind.rawValue): \(message)" }

    /// The error object of the API.
    public var json: JSONValue {
        var members = [JSONMember("kind", .string(kind.rawValue)), JSONMember("message", .string(message))]
        if let node { members.append(JSONMember("node", .string(node))) }
        if let status { members.append(JSONMember("status", .int(status))) }
        if let errors { members.append(JSONMember("errors", .array(errors.map(\.json)))) }
        return .object(members)
    }

    /// Reads an error object written by `json`; `nil` if it is not one.
    public init?(json: JSONValue) {
        guard let kindText = json["kind"]?.stringValue, let kind = ErrorKind(rawValue: kindText) else { return nil }
        self.kind = kind
        self.message = json["message"]?.stringValue ?? ""
        self.node = json["node"]?.stringValue
        self.status = json["status"]?.intValue
        if let list = json["errors"]?.arrayValue {
            self.errors = list.compactMap { NodeError(json: $0) }
        } else {
            self.errors = nil
        }
    }
}
