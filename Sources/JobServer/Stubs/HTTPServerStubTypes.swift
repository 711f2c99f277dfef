// STAND-IN for module HTTPServer (agreed API only). Dropped at merge in favour of `import HTTPServer`.
import Foundation

/// Stand-in: HTTP header fields in order, names compared case-insensitively.
public struct HTTPHeaders: Sequence {
    private var fields: [(name: String, value: String)] = []

    public init() {}

    public init(_ pairs: [(String, String)]) {
        fields = pairs.map { (name: $0.0, value: $0.1) }
    }

    public subscript(name: String) -> String? {
        fields.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    public func values(_ name: String) -> [String] {
        fields.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
    }

    public mutating func add(_ name: String, _ value: String) { fields.append((name: name, value: value)) }

    public mutating func set(_ name: String, _ value: String) {
        remove(name)
        add(name, value)
    }

    public mutating func remove(_ name: String) { fields.removeAll { $0.name.lowercased() == name.lowercased() } }

    public func contains(_ name: String) -> Bool { self[name] != nil }

    public func makeIterator() -> IndexingIterator<[(name: String, value: String)]> { fields.makeIterator() }
}

/// Stand-in: the HTTP version of a request.
public struct HTTPVersion: Sendable {
    public var major: Int
    public var minor: Int
}

/// Stand-in: one parsed request.
public struct HTTPRequest {
    public var method: String
    public var target: String
    public var path: String
    public var query: String?
    public var version: HTTPVersion
    public var headers: HTTPHeaders
    public var body: [UInt8]
    public var pathParameters: [String: String]
    public var routePattern: String?
    public var remoteAddress: String

    public func queryItems() -> [(name: String, value: String)] {
        guard let query, !query.isEmpty else { return [] }
        return query.split(separator: "&", omittingEmptySubsequences: true).map { part in
            let pieces = part.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ s: Substring) -> String {
                let plus = s.replacingOccurrences(of: "+", with: " ")
                return plus.removingPercentEncoding ?? plus
            }
            return (name: decode(pieces[0]), value: pieces.count > 1 ? decode(pieces[1]) : "")
        }
    }

    public func queryValue(_ name: String) -> String? { queryItems().first { $0.name == name }?.value }
}

/// Stand-in: a response.
public struct HTTPResponse {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: [UInt8]

    public init(status: Int, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// Stand-in: completes one request, from any thread, once.
public final class HTTPResponder: @unchecked Sendable {
    private let lock = NSLock()
    private var sent = false
    private var closeAction: (@Sendable () -> Void)?
    private let write: (HTTPResponse) -> Void

    init(write: @escaping (HTTPResponse) -> Void) { self.write = write }

    public func send(_ response: HTTPResponse) {
        lock.lock()
        let first = !sent
        sent = true
        lock.unlock()
        if first { write(response) }
    }

    public var onClose: (@Sendable () -> Void)? {
        get { lock.lock(); defer { lock.unlock() }; return closeAction }
        set { lock.lock(); closeAction = newValue; lock.unlock() }
    }
}

/// Stand-in: the handler type.
public typealias HTTPHandler = (HTTPRequest, HTTPResponder) -> Void

/// Stand-in: method + path pattern → handler.
public final class Router {
    struct Route {
        var method: String
        var pattern: String
        var segments: [Substring]
        var handler: HTTPHandler
    }

    private(set) var routes: [Route] = []

    public init() {}

    public func add(_ method: String, _ pattern: String, _ handler: @escaping HTTPHandler) {
        routes.append(Route(method: method, pattern: pattern, segments: pattern.split(separator: "/"), handler: handler))
    }

    enum Match {
        case found(Route, [String: String])
        case methodNotAllowed([String])
        case notFound
    }

    func match(method: String, path: String) -> Match {
        let parts = path.split(separator: "/")
        var allowed: [String] = []
        for route in routes where route.segments.count == parts.count {
            var params: [String: String] = [:]
            var ok = true
            for (seg, part) in zip(route.segments, parts) {
                if seg.hasPrefix("{") && seg.hasSuffix("}") {
                    params[String(seg.dropFirst().dropLast())] = String(part).removingPercentEncoding ?? String(part)
                } else if seg != part {
                    ok = false
                    break
                }
            }
            guard ok else { continue }
            if route.method == method || (method == "HEAD" && route.method == "GET") {
                return .found(route, params)
            }
            allowed.append(route.method)
        }
        return allowed.isEmpty ? .notFound : .methodNotAllowed(allowed)
    }
}

/// Stand-in: server settings.
public struct HTTPServerConfiguration {
    public var host = "0.0.0.0"
    public var port = 8080
    public var maxRequestBodyBytes = 1 << 20
    public var maxHeaderBytes = 16384
    public var maxTargetBytes = 8192
    public var headerTimeoutSeconds = 10.0
    public var idleTimeoutSeconds = 60.0
    public var eventLoopCount: Int = 2
    public var maxConnections = 10_000
    public var onResponse: (@Sendable (String?, String, Int, UInt64) -> Void)?
    public init() {}
}
