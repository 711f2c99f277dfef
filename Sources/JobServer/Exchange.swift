import Foundation
import HTTPServer
import JobCore
import Synchronization

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
    // @unchecked: every stored property is immutable; `answered` is an Atomic, so exactly one `send` wins;
    // `registerOnClose` is only called on the handler's thread, before the handler hands the exchange on.
    /// From a safe `X-Request-Id` header, else generated.
    let requestID: String
    private let method: String
    private let path: String
    private let logger: Logger
    private let startedNs = DispatchTime.now().uptimeNanoseconds
    private let deliver: @Sendable (HTTPResponse) -> Void
    private let registerOnClose: (@escaping @Sendable () -> Void) -> Void
    /// Answers with a streamed body (`HTTPResponder.startStream`); `nil` where there is no connection to stream on.
    private let startStream: (@Sendable (HTTPResponse, Int) -> HTTPStream)?
    /// Set by the first `send`; an atomic flag rather than a lock, which would cost an allocation per request.
    private let answered = Atomic<Bool>(false)

    /// - Parameters:
    ///   - deliver: hands the finished response to the connection (`HTTPResponder.send`).
    ///   - registerOnClose: arranges for an action to run when the client goes away (`HTTPResponder.onClose`).
    init(
        request: APIRequest, logger: Logger, deliver: @escaping @Sendable (HTTPResponse) -> Void,
        registerOnClose: @escaping (@escaping @Sendable () -> Void) -> Void,
        startStream: (@Sendable (HTTPResponse, Int) -> HTTPStream)? = nil
    ) {
        self.requestID = Self.requestID(from: request.headers)
        self.method = request.method
        self.path = request.path
        self.logger = logger
        self.deliver = deliver
        self.registerOnClose = registerOnClose
        self.startStream = startStream
    }

    /// Sends `response` unless one was sent already.
    func send(_ response: HTTPResponse) {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return }
        var response = response
        response.headers.set("X-Request-Id", requestID)
        // The fields are only built when the line is written: on a busy read route they cost more than the answer.
        if logger.minimumLevel <= .info {
            let durationMs = Int((DispatchTime.now().uptimeNanoseconds - startedNs + 500_000) / 1_000_000)
            logger.info(
                "request",
                [
                    "request_id": .string(requestID), "method": .string(method), "path": .string(path),
                    "status": .int(response.status), "duration_ms": .int(durationMs),
                ])
        }
        deliver(response)
    }

    /// Answers with `head` and a body written later through the returned stream, unless an answer was sent already
    /// or this exchange has no connection to stream on (then `nil`). Logged when the head goes out.
    func stream(_ head: HTTPResponse, maxBufferedBytes: Int) -> HTTPStream? {
        guard let startStream, !answered.exchange(true, ordering: .acquiringAndReleasing) else { return nil }
        var head = head
        head.headers.set("X-Request-Id", requestID)
        if logger.minimumLevel <= .info {
            logger.info(
                "request",
                [
                    "request_id": .string(requestID), "method": .string(method), "path": .string(path),
                    "status": .int(head.status), "streamed": .bool(true),
                ])
        }
        return startStream(head, maxBufferedBytes)
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
        return freshID()
    }

    /// Seeds from the system's generator, once: two `getrandom` calls per request cost more than a cached answer.
    private static let idSeed: (UInt64, UInt64) = {
        var generator = SystemRandomNumberGenerator()
        return (generator.next(), generator.next())
    }()
    private static let idCounter = Atomic<UInt64>(0)

    /// 32 hex digits, never the same twice in a process (splitmix64's finaliser is a bijection of the counter) and
    /// not guessable from earlier ones without the random seed.
    static func freshID() -> String {
        let n = idCounter.wrappingAdd(1, ordering: .relaxed).newValue
        let high = mix(idSeed.0 &+ n)
        let low = mix(idSeed.1 ^ (n &* 0x9E37_79B9_7F4A_7C15))
        return String(unsafeUninitializedCapacity: 32) { buffer in
            let digits: StaticString = "0123456789abcdef"
            let table = digits.utf8Start
            for i in 0..<16 {
                buffer[i] = table[Int((high >> (60 - 4 * UInt64(i))) & 0xF)]
                buffer[16 + i] = table[Int((low >> (60 - 4 * UInt64(i))) & 0xF)]
            }
            return 32
        }
    }

    private static func mix(_ value: UInt64) -> UInt64 {
        var z = value &+ 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
