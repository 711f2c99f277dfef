/// Handles one request. Runs on the event-loop thread that read the request and must never block it:
/// do slow work elsewhere and call `responder.send` later, from any thread.
public typealias HTTPHandler = (HTTPRequest, HTTPResponder) -> Void

/// Maps method + path pattern to handlers. Patterns are literal segments and `{name}` captures,
/// e.g. `/v1/jobs/{id}/nodes/{node}`. Add every route before the server starts.
///
/// Unknown paths answer `404 not_found`; a known path with another method answers
/// `405 method_not_allowed` with an `Allow` header. `HEAD` runs the `GET` handler when no
/// `HEAD` handler is registered (the server drops the body and keeps `Content-Length`).
/// Routes are read concurrently by every event loop and never changed once the server started,
/// hence `@unchecked Sendable`.
public final class Router: @unchecked Sendable {
    // @unchecked: routes are added before `HTTPServer.start` (thread start orders the writes before every loop's
    // reads) and only read afterwards.
    private enum Segment {
        case literal(String)
        case parameter(String)
    }

    private final class Route {
        let pattern: String
        let segments: [Segment]
        var handlers: [String: HTTPHandler] = [:]
        init(pattern: String, segments: [Segment]) {
            self.pattern = pattern
            self.segments = segments
        }
    }

    /// Patterns without captures, found by one dictionary lookup.
    private var literalRoutes: [String: Route] = [:]
    /// Patterns with captures, tried in the order they were added.
    private var patternRoutes: [Route] = []

    /// Answers requests no route takes, given the `404` or `405` the router would send; by default it sends
    /// that. Lets an application answer first what must come before routing, such as a `401`.
    public var unmatched: (HTTPRequest, HTTPResponder, HTTPResponse) -> Void = { _, responder, response in
        responder.send(response)
    }

    /// An empty router.
    public init() {}

    /// Registers `handler` for `method` on `pattern`.
    /// - Parameters:
    ///   - method: the method, compared exactly (`GET`, `POST`, …).
    ///   - pattern: a path such as `/v1/jobs/{id}`; `{name}` matches one non-empty segment.
    ///   - handler: called on the event loop; must not block.
    public func add(_ method: String, _ pattern: String, _ handler: @escaping HTTPHandler) {
        let segments: [Segment] = pattern.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map { part in
            if part.hasPrefix("{") && part.hasSuffix("}") && part.count >= 2 {
                return .parameter(String(part.dropFirst().dropLast()))
            }
            return .literal(String(part))
        }
        let hasParameters = segments.contains { if case .parameter = $0 { return true } else { return false } }
        if !hasParameters {
            let route = literalRoutes[pattern] ?? Route(pattern: pattern, segments: segments)
            route.handlers[method] = handler
            literalRoutes[pattern] = route
            return
        }
        if let route = patternRoutes.first(where: { $0.pattern == pattern }) {
            route.handlers[method] = handler
        } else {
            let route = Route(pattern: pattern, segments: segments)
            route.handlers[method] = handler
            patternRoutes.append(route)
        }
    }

    /// Finds the handler for `request` and runs it, or answers 404 / 405 through `responder`.
    /// Sets `pathParameters` and `routePattern` on the request handed to the handler.
    public func route(_ request: HTTPRequest, _ responder: HTTPResponder) {
        var request = request
        var allowed: Set<String> = []
        var allowedPattern: String?
        if let route = literalRoutes[request.path] {
            if let handler = handler(in: route, for: request.method) {
                request.routePattern = route.pattern
                responder.routePattern = route.pattern
                handler(request, responder)
                return
            }
            allowed.formUnion(route.handlers.keys)
            allowedPattern = route.pattern
        }
        if !patternRoutes.isEmpty {
            let parts = Self.segments(of: request.path).dropFirst()
            for route in patternRoutes {
                guard let parameters = match(route.segments, parts) else { continue }
                if let handler = handler(in: route, for: request.method) {
                    request.routePattern = route.pattern
                    request.pathParameters = parameters
                    responder.routePattern = route.pattern
                    handler(request, responder)
                    return
                }
                allowed.formUnion(route.handlers.keys)
                allowedPattern = allowedPattern ?? route.pattern
            }
        }
        if allowed.isEmpty {
            unmatched(request, responder, .error(status: 404, code: "not_found", message: "no route for \(request.path)"))
            return
        }
        if allowed.contains("GET") { allowed.insert("HEAD") }
        responder.routePattern = allowedPattern
        var response = HTTPResponse.error(status: 405, code: "method_not_allowed",
                                          message: "\(request.method) is not allowed on \(request.path)")
        response.headers.add("Allow", allowed.sorted().joined(separator: ", "))
        unmatched(request, responder, response)
    }

    private func handler(in route: Route, for method: String) -> HTTPHandler? {
        if let handler = route.handlers[method] { return handler }
        if method == "HEAD" { return route.handlers["GET"] }
        return nil
    }

    /// `path` split at every `/`, empty parts kept; split as bytes (`/` is ASCII), not as Characters, which would
    /// walk grapheme clusters on every request.
    private static func segments(of path: String) -> [Substring] {
        var parts: [Substring] = []
        let utf8 = path.utf8
        var start = utf8.startIndex
        var i = start
        while i != utf8.endIndex {
            if utf8[i] == UInt8(ascii: "/") {
                parts.append(path[start..<i])
                start = utf8.index(after: i)
            }
            i = utf8.index(after: i)
        }
        parts.append(path[start...])
        return parts
    }

    private func match(_ segments: [Segment], _ parts: ArraySlice<Substring>) -> [String: String]? {
        guard segments.count == parts.count else { return nil }
        var parameters: [String: String] = [:]
        for (segment, part) in zip(segments, parts) {
            switch segment {
            case .literal(let literal):
                // Byte for byte, as HTTP compares targets (and without grapheme breaking on every request).
                if !part.utf8.elementsEqual(literal.utf8) { return nil }
            case .parameter(let name):
                if part.isEmpty { return nil }
                parameters[name] = percentDecode(part, plusAsSpace: false)
            }
        }
        return parameters
    }
}
