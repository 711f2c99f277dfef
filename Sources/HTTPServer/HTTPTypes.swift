/// The HTTP versions the server speaks.
public enum HTTPVersion: Sendable, Equatable {
    /// HTTP/1.0: the connection closes after the response unless the client asked for keep-alive.
    case http1_0
    /// HTTP/1.1: persistent connections by default.
    case http1_1
}

/// Ordered header fields; names keep their spelling and are compared case-insensitively.
public struct HTTPHeaders: Sequence, Sendable, Equatable {
    @usableFromInline var storage: [(String, String)]

    /// An empty header list.
    public init() {
        storage = []
    }

    /// Headers from `(name, value)` pairs, in order.
    public init(_ pairs: [(String, String)]) {
        storage = pairs
    }

    /// The number of fields, counting repeated names separately.
    public var count: Int { storage.count }

    /// The first value of `name`, or nil.
    public subscript(name: String) -> String? {
        for (key, value) in storage where asciiCaseInsensitiveEquals(key, name) {
            return value
        }
        return nil
    }

    /// Every value of `name`, in order.
    public func values(_ name: String) -> [String] {
        storage.compactMap { asciiCaseInsensitiveEquals($0.0, name) ? $0.1 : nil }
    }

    /// Appends a field, keeping any earlier ones of the same name.
    public mutating func add(_ name: String, _ value: String) {
        storage.append((name, value))
    }

    /// Replaces every field of `name` by one with `value`.
    public mutating func set(_ name: String, _ value: String) {
        remove(name)
        storage.append((name, value))
    }

    /// Removes every field of `name`.
    public mutating func remove(_ name: String) {
        storage.removeAll { asciiCaseInsensitiveEquals($0.0, name) }
    }

    /// Whether a field of `name` is present.
    public func contains(_ name: String) -> Bool {
        storage.contains { asciiCaseInsensitiveEquals($0.0, name) }
    }

    /// Iterates the fields as `(name, value)` in order.
    public func makeIterator() -> IndexingIterator<[(String, String)]> {
        storage.makeIterator()
    }

    /// Equal when the same fields appear in the same order (names compared case-insensitively).
    public static func == (lhs: HTTPHeaders, rhs: HTTPHeaders) -> Bool {
        guard lhs.storage.count == rhs.storage.count else { return false }
        for (l, r) in zip(lhs.storage, rhs.storage) {
            if !asciiCaseInsensitiveEquals(l.0, r.0) || l.1 != r.1 { return false }
        }
        return true
    }
}

/// Compares two strings byte by byte, folding ASCII letters only (header names are ASCII tokens).
@inlinable
func asciiCaseInsensitiveEquals(_ a: String, _ b: String) -> Bool {
    var a = a, b = b
    return a.withUTF8 { pa in
        b.withUTF8 { pb in
            guard pa.count == pb.count else { return false }
            for i in 0..<pa.count {
                let x = pa[i], y = pb[i]
                if x == y { continue }
                let folded = x | 0x20
                if folded != (y | 0x20) || folded < 0x61 || folded > 0x7A { return false }
            }
            return true
        }
    }
}

/// One parsed request, as handed to a handler.
public struct HTTPRequest: Sendable {
    /// The method as sent, e.g. `GET`.
    public var method: String
    /// The raw request target as sent.
    public var target: String
    /// The path part of the target (an absolute-form target reduced to its path), not percent-decoded.
    public var path: String
    /// The raw query without `?`, or nil when the target has none.
    public var query: String?
    /// The protocol version of the request.
    public var version: HTTPVersion
    /// The header fields in the order received.
    public var headers: HTTPHeaders
    /// The whole request body (chunked bodies de-chunked).
    public var body: [UInt8]
    /// Parameters captured by the router's `{name}` segments, percent-decoded.
    public var pathParameters: [String: String]
    /// The pattern of the route that matched, e.g. `/v1/jobs/{id}`; set by the router.
    public var routePattern: String?
    /// The peer's address as `host:port`.
    public var remoteAddress: String

    /// A request built by hand (tests, internal dispatch); `path` and `query` are derived from `target`.
    public init(method: String, target: String, version: HTTPVersion = .http1_1, headers: HTTPHeaders = HTTPHeaders(),
                body: [UInt8] = [], remoteAddress: String = "") {
        self.method = method
        self.target = target
        let split = splitTarget(target) ?? (target, nil)
        self.path = split.path
        self.query = split.query
        self.version = version
        self.headers = headers
        self.body = body
        self.pathParameters = [:]
        self.routePattern = nil
        self.remoteAddress = remoteAddress
    }

    init(method: String, target: String, path: String, query: String?, version: HTTPVersion,
         headers: HTTPHeaders, body: [UInt8], remoteAddress: String) {
        self.method = method
        self.target = target
        self.path = path
        self.query = query
        self.version = version
        self.headers = headers
        self.body = body
        self.pathParameters = [:]
        self.routePattern = nil
        self.remoteAddress = remoteAddress
    }

    /// The query's `name=value` pairs in order, percent-decoded, `+` read as a space.
    public func queryItems() -> [(name: String, value: String)] {
        guard let query = query, !query.isEmpty else { return [] }
        var items: [(name: String, value: String)] = []
        for part in query.split(separator: "&", omittingEmptySubsequences: true) {
            if let eq = part.firstIndex(of: "=") {
                items.append((percentDecode(part[..<eq], plusAsSpace: true),
                              percentDecode(part[part.index(after: eq)...], plusAsSpace: true)))
            } else {
                items.append((percentDecode(part, plusAsSpace: true), ""))
            }
        }
        return items
    }

    /// The first value of the query parameter `name`, percent-decoded, or nil.
    public func queryValue(_ name: String) -> String? {
        queryItems().first { $0.name == name }?.value
    }
}

/// A response a handler gives back; the server adds `Date`, `Server`, `Content-Length` and `Connection`.
public struct HTTPResponse: Sendable {
    /// The status code.
    public var status: Int
    /// Header fields; `Content-Length`, `Date`, `Server` and `Transfer-Encoding` set here are replaced by the server's.
    /// `Connection: close` makes the server close the connection after this response.
    public var headers: HTTPHeaders
    /// The body; dropped on the wire for `HEAD` requests and for 1xx, 204 and 304.
    public var body: [UInt8]
    /// More of the body, sent after `body` in order, each array queued as it is (by reference when large): an answer
    /// made of several arrays goes out without being copied into one. Ignored with `bodyFile`.
    public var bodyPieces: [[UInt8]]
    /// What `body` belongs to, if a handler shares it between answers (a cache of large answers): the server holds
    /// it for as long as it holds the body and lets go of both together, off the event loops. The owner can so tell,
    /// by its deinitialisation, when no connection needs the body any more.
    public var bodyOwner: (any AnyObject & Sendable)?
    /// The body as the first bytes of an open file, in place of `body` (which is then ignored): sent from the page
    /// cache by `sendfile`, never read into memory. The file must stay open and unchanged while the server holds
    /// the answer: `bodyOwner` is what keeps it so (the server holds the owner until the body is sent or dropped).
    public var bodyFile: HTTPFileBody?

    /// A response with the given status, headers and body.
    public init(status: Int, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
        self.bodyPieces = []
        self.bodyOwner = nil
        self.bodyFile = nil
    }

    /// How many bytes the body has: `bodyFile`'s, or `body`'s and `bodyPieces`'.
    public var bodyCount: Int { bodyFile?.count ?? bodyPieces.reduce(body.count) { $0 + $1.count } }

    /// A protocol-level error response: `{"error":{"code":…,"message":…}}` as `application/json`.
    /// - Parameters:
    ///   - status: the status code, e.g. 400.
    ///   - code: the machine-readable code, e.g. `bad_request`.
    ///   - message: a human-readable explanation.
    public static func error(status: Int, code: String, message: String) -> HTTPResponse {
        var body: [UInt8] = []
        body.reserveCapacity(40 + code.utf8.count + message.utf8.count)
        body.append(contentsOf: Array(#"{"error":{"code":"#.utf8))
        appendJSONString(code, to: &body)
        body.append(contentsOf: Array(#","message":"#.utf8))
        appendJSONString(message, to: &body)
        body.append(contentsOf: Array("}}".utf8))
        return HTTPResponse(status: status, headers: HTTPHeaders([("Content-Type", "application/json")]), body: body)
    }
}

/// A response body kept in a file: its first `count` bytes, read through `fd`, which its owner keeps open.
public struct HTTPFileBody: Sendable, Equatable {
    public let fd: Int32
    public let count: Int

    public init(fd: Int32, count: Int) {
        self.fd = fd
        self.count = count
    }
}

/// Appends `text` as a JSON string literal, escaping quotes, backslashes and control characters.
func appendJSONString(_ text: String, to out: inout [UInt8]) {
    let hex: [UInt8] = Array("0123456789abcdef".utf8)
    out.append(UInt8(ascii: "\""))
    for byte in text.utf8 {
        switch byte {
        case UInt8(ascii: "\""): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
        case UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
        case 0x0A: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
        case 0x0D: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
        case 0x09: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
        case 0..<0x20:
            out.append(contentsOf: Array("\\u00".utf8))
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0xF)])
        default: out.append(byte)
        }
    }
    out.append(UInt8(ascii: "\""))
}

/// Splits a request target into path and query; absolute-form (`http://host/p?q`) is reduced to its path.
/// Returns nil for a target that is neither origin-form, absolute-form nor `*`.
func splitTarget(_ target: String) -> (path: String, query: String?)? {
    let utf8 = target.utf8
    guard let first = utf8.first else { return nil }
    var rest = Substring(target)
    if first != UInt8(ascii: "/") {
        if target == "*" { return ("*", nil) }
        let lower = target.prefix(8).lowercased()
        let schemeLength: Int
        if lower.hasPrefix("http://") {
            schemeLength = 7
        } else if lower.hasPrefix("https://") {
            schemeLength = 8
        } else {
            return nil
        }
        let afterScheme = target.utf8.index(target.utf8.startIndex, offsetBy: schemeLength)
        let authorityAndRest = target[afterScheme...]
        guard let cut = authorityAndRest.firstIndex(where: { $0 == "/" || $0 == "?" }) else {
            return authorityAndRest.isEmpty ? nil : ("/", nil)
        }
        if cut == authorityAndRest.startIndex { return nil }
        rest = authorityAndRest[cut...]
        if rest.first == "?" {
            return ("/", String(rest.dropFirst()))
        }
    }
    // Searched as bytes: a Character search walks grapheme clusters, which costs more than the rest of routing.
    if let q = rest.utf8.firstIndex(of: UInt8(ascii: "?")) {
        return (String(rest[..<q]), String(rest[rest.utf8.index(after: q)...]))
    }
    return (String(rest), nil)
}

/// Decodes `%XX` escapes (invalid escapes are kept as they are) and optionally `+` as a space.
func percentDecode<S: StringProtocol>(_ text: S, plusAsSpace: Bool) -> String {
    let bytes = Array(text.utf8)
    if !bytes.contains(UInt8(ascii: "%")) && !(plusAsSpace && bytes.contains(UInt8(ascii: "+"))) {
        return String(text)
    }
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count)
    var i = 0
    while i < bytes.count {
        let b = bytes[i]
        if b == UInt8(ascii: "%"), i + 2 < bytes.count,
           let hi = hexValue(bytes[i + 1]), let lo = hexValue(bytes[i + 2]) {
            out.append(hi << 4 | lo)
            i += 3
        } else if b == UInt8(ascii: "+") && plusAsSpace {
            out.append(UInt8(ascii: " "))
            i += 1
        } else {
            out.append(b)
            i += 1
        }
    }
    return String(decoding: out, as: UTF8.self)
}

@inline(__always)
func hexValue(_ b: UInt8) -> UInt8? {
    switch b {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): return b - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): return b - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): return b - UInt8(ascii: "A") + 10
    default: return nil
    }
}
