import Foundation
import HTTPServer
import JobCore
import Threads

/// `GET /v1/jobs/{id}/events` (API.md §8): Server-Sent Events of one job, fed by `Engine.watchEvents`.
///
/// A stream holds no thread: the engine hands each batch of changes to one shared queue, which writes it to every
/// stream of the job (the text made once per batch), and the connection's loop sends it when the client reads.
/// A client that reads too slowly is dropped by `HTTPStream`'s bound rather than buffered without end.
final class EventStreams: @unchecked Sendable {
    // @unchecked: `open` is a Locked; `engine`, `logger` and `keepAliveIntervalMs` are immutable; `timer` is set once
    // under `open`'s lock.
    private let engine: Engine
    private let logger: Logger
    /// Streams open now, for the keep-alive comments.
    private let open = Locked<[ObjectIdentifier: HTTPStream]>([:])
    private var timer: DispatchSourceTimer?
    private let keepAliveIntervalMs: Int
    /// A written event the client has not read may wait this long in memory per stream; then the stream closes.
    static let maxBufferedBytes = 1 << 20

    init(engine: Engine, logger: Logger, keepAliveIntervalMs: Int = 15_000) {
        self.engine = engine
        self.logger = logger
        self.keepAliveIntervalMs = keepAliveIntervalMs
    }

    /// Streams open now.
    var count: Int { open.withLock { $0.count } }

    /// Answers the route: 400 for a bad `since` / `Last-Event-ID`, 404 for an unknown job, else the stream.
    func serve(_ request: APIRequest, _ exchange: Exchange) throws {
        let id = request.pathParameters["id"] ?? ""
        var since = try QueryParameters.jobWait(request.queryItems).sinceVersion
        if let header = request.headers["Last-Event-ID"] {
            let text = header.trimmingCharacters(in: .whitespaces)
            guard !text.isEmpty, text.utf8.count <= 18, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
                let version = Int64(text)
            else {
                throw QueryError(message: "Last-Event-ID must be a job version (a non-negative integer), not \"\(header)\"")
            }
            since = version
        }
        let subscription = Subscription()
        exchange.onClose { subscription.cancel() }
        let token = engine.watchEvents(id: id, afterVersion: since) { [self] batch in
            deliver(batch, id: id, exchange: exchange, subscription: subscription)
        }
        subscription.hold(token)
    }

    /// On the engine's event queue, in order.
    private func deliver(_ batch: JobEventBatch?, id: String, exchange: Exchange, subscription: Subscription) {
        guard let batch else {
            exchange.send(App.error(404, "not_found", "no job with id \(id)"))
            return
        }
        let stream: HTTPStream
        if let started = subscription.stream {
            stream = started
        } else {
            let head = HTTPResponse(
                status: 200,
                headers: HTTPHeaders([
                    ("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"),
                ]))
            guard let started = exchange.stream(head, maxBufferedBytes: Self.maxBufferedBytes) else {
                subscription.cancel()
                return
            }
            stream = started
            subscription.stream = started
            let key = ObjectIdentifier(started)
            started.onClose = { [weak self] in
                subscription.cancel()
                self?.open.withLock { _ = $0.removeValue(forKey: key) }
            }
            add(started)
        }
        let written = stream.write(batch.rendered(EventStreamText.render))
        if batch.isLast || !written {
            stream.finish()
            subscription.cancel()
            _ = open.withLock { $0.removeValue(forKey: ObjectIdentifier(stream)) }
        }
    }

    private func add(_ stream: HTTPStream) {
        open.withLock { streams in
            streams[ObjectIdentifier(stream)] = stream
            guard timer == nil else { return }
            let timer = DispatchSource.makeTimerSource(queue: DispatchQueue.global(qos: .utility))
            let interval = DispatchTimeInterval.milliseconds(keepAliveIntervalMs)
            timer.schedule(deadline: .now() + interval, repeating: interval)
            timer.setEventHandler { [weak self] in self?.keepAlive() }
            timer.resume()
            self.timer = timer
        }
    }

    /// A comment line on every open stream, so that proxies keep it open and a client that went away is found.
    private func keepAlive() {
        let streams = open.withLock { Array($0.values) }
        for stream in streams { stream.write(EventStreamText.keepAlive) }
    }

    /// One stream's link to the engine: the token that stops its batches, and the stream once started. Cancelled
    /// from the connection's loop (the client went away) or the event queue (the job settled).
    private final class Subscription: @unchecked Sendable {
        // @unchecked: `token` and `cancelled` are guarded by `lock`; `stream` is read and written only on the engine's
        // event queue, where batches arrive one at a time.
        private let lock = Lock()
        private var token: Cancellable?
        private var cancelled = false
        var stream: HTTPStream?

        func hold(_ token: Cancellable) {
            let cancelNow = lock.withLock { () -> Bool in
                if cancelled { return true }
                self.token = token
                return false
            }
            if cancelNow { token.cancel() }
        }

        func cancel() {
            let token = lock.withLock { () -> Cancellable? in
                cancelled = true
                defer { self.token = nil }
                return self.token
            }
            token?.cancel()
        }
    }
}

/// The text of the event stream (the WHATWG HTML "server-sent events" format).
enum EventStreamText {
    static let keepAlive: [UInt8] = Array(": keep-alive\n\n".utf8)

    /// A batch's events: each changed node (`event: node`), then the job (`event: job`) when its state changed, at
    /// the start and at the end. Each `id:` is the job's version.
    @Sendable static func render(_ batch: JobEventBatch) -> [UInt8] {
        var out: [UInt8] = []
        let id = Array(String(batch.job.version).utf8)
        for node in batch.nodes {
            append(event: "node", id: id, data: Presentation.node(node, includeResult: false).bytes, to: &out)
        }
        if batch.jobStateChanged || batch.isLast {
            append(event: "job", id: id, data: Presentation.job(batch.job, includeResult: false).bytes, to: &out)
        }
        return out
    }

    /// One event. `data` is compact JSON, which holds no line break (JSON escapes them in strings).
    static func append(event: String, id: [UInt8], data: [UInt8], to out: inout [UInt8]) {
        out.append(contentsOf: Array("event: \(event)\nid: ".utf8))
        out.append(contentsOf: id)
        out.append(contentsOf: Array("\ndata: ".utf8))
        out.append(contentsOf: data)
        out.append(contentsOf: Array("\n\n".utf8))
    }
}
