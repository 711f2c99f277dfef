import Foundation
import HTTPServer
import JobCore

/// A request as the routes see it: what they need of `HTTPRequest`, built by tests without a socket.
struct APIRequest {
    var method: String
    var path: String
    var headers: HTTPHeaders
    var body: [UInt8]
    var queryItems: [(name: String, value: String)]
    var pathParameters: [String: String]

    init(
        method: String, path: String, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = [],
        queryItems: [(name: String, value: String)] = [], pathParameters: [String: String] = [:]
    ) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.queryItems = queryItems
        self.pathParameters = pathParameters
    }

    init(_ request: HTTPRequest) {
        self.init(
            method: request.method, path: request.path, headers: request.headers, body: request.body,
            queryItems: request.queryItems(), pathParameters: request.pathParameters)
    }
}

/// One request's answer: sent once, from any thread, with `X-Request-Id` echoed and one log line.
final class Exchange: @unchecked Sendable {
    /// From a safe `X-Request-Id` header, else generated.
    let requestID: String
    private let method: String
    private let path: String
    private let logger: Logger
    private let startedNs = DispatchTime.now().uptimeNanoseconds
    private let deliver: @Sendable (HTTPResponse) -> Void
    private let registerOnClose: (@escaping @Sendable () -> Void) -> Void
    private let lock = NSLock()
    private var answered = false

    /// - Parameters:
    ///   - deliver: hands the finished response to the connection (`HTTPResponder.send`).
    ///   - registerOnClose: arranges for an action to run when the client goes away (`HTTPResponder.onClose`).
    init(
        request: APIRequest, logger: Logger, deliver: @escaping @Sendable (HTTPResponse) -> Void,
        registerOnClose: @escaping (@escaping @Sendable () -> Void) -> Void
    ) {
        self.requestID = Self.requestID(from: request.headers)
        self.method = request.method
        self.path = request.path
        self.logger = logger
        self.deliver = deliver
        self.registerOnClose = registerOnClose
    }

    /// Sends `response` unless one was sent already.
    func send(_ response: HTTPResponse) {
        lock.lock()
        let first = !answered
        answered = true
        lock.unlock()
        guard first else { return }
        var response = response
        response.headers.set("X-Request-Id", requestID)
        let durationMs = Int((DispatchTime.now().uptimeNanoseconds - startedNs + 500_000) / 1_000_000)
        logger.info(
            "request",
            [
                "request_id": .string(requestID), "method": .string(method), "path": .string(path),
                "status": .int(response.status), "duration_ms": .int(durationMs),
            ])
        deliver(response)
    }

    /// Runs `action` when the client goes away before the answer.
    func onClose(_ action: @escaping @Sendable () -> Void) { registerOnClose(action) }

    /// A client's `X-Request-Id` if it is 1–200 visible ASCII characters (`!`…`~`), else a fresh random id.
    static func requestID(from headers: HTTPHeaders) -> String {
        if let given = headers["X-Request-Id"], (1...200).contains(given.utf8.count),
            given.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E })
        {
            return given
        }
        var generator = SystemRandomNumberGenerator()
        let high = generator.next() as UInt64
        let low = generator.next() as UInt64
        return hex(high) + hex(low)
    }

    private static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
