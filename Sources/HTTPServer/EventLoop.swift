import CHTTPLinux
import Glibc
import Synchronization
import Threads

/// One accepted connection; owned by its event loop and touched only on that loop's thread.
final class Connection {
    let fd: Int32
    /// `fd` plus a per-loop serial number in the high bits: the epoll user data. A stale event for a
    /// descriptor number that was closed and reused within one batch then finds no connection.
    let token: UInt64
    var parser: HTTPRequestParser
    /// Every decision about reading, time limits, lingering and closing.
    var machine: ConnectionStateMachine
    /// Received bytes not parsed yet, from `inOffset` on (while a response is pending or too many answers are
    /// unsent, pipelined requests wait here).
    var inBuffer: [UInt8] = []
    var inOffset = 0
    /// What is still to be sent, in order.
    var output = OutputQueue()
    /// The request dispatched and not answered yet; later requests wait behind it.
    var pending: HTTPResponder?
    /// The streamed body being written, while `pending` is its request.
    var stream: HTTPStream?
    var closed = false
    /// Whether the connection outlives its stream (decided when the head went out).
    var streamKeepAlive = false
    /// Counted in `EventLoop.activeConnections` (until it lingers or closes).
    var countedActive = true
    /// True while the loop is feeding this connection's bytes to the parser (responses are then flushed afterwards).
    var processing = false
    var interest: UInt32

    init(fd: Int32, serial: UInt32, limits: HTTPParserLimits, timeouts: ConnectionStateMachine.Timeouts,
         remoteAddress: String, now: UInt64, interest: UInt32) {
        self.fd = fd
        self.token = UInt64(serial) << 32 | UInt64(UInt32(bitPattern: fd))
        self.parser = HTTPRequestParser(limits: limits, remoteAddress: remoteAddress)
        self.machine = ConnectionStateMachine(timeouts: timeouts, now: now)
        self.interest = interest
    }

    var hasOutput: Bool { !output.isEmpty }
    /// Received bytes still to parse.
    var bufferedInput: Int { inBuffer.count - inOffset }

    /// What the state machine is shown of the parser and buffers.
    var buffers: ConnectionStateMachine.Buffers {
        ConnectionStateMachine.Buffers(parserIdle: parser.isIdle, readingBody: parser.isReadingBody,
                                       hasOutput: hasOutput, bufferedInput: bufferedInput)
    }

    func dropInput() {
        inBuffer = []
        inOffset = 0
    }
}

/// Settings every loop shares, fixed at start.
struct LoopSettings {
    var limits: HTTPParserLimits
    var timeouts: ConnectionStateMachine.Timeouts
    var maxConnections: Int
    var onResponse: (@Sendable (String?, String, Int, UInt64) -> Void)?
    var onWriteBlocked: (@Sendable () -> Void)?
    var onListenerClosed: (@Sendable () -> Void)?
    var router: Router
}

/// One thread running `epoll`: accepts on its own `SO_REUSEPORT` socket, reads, parses, dispatches,
/// writes. Cross-thread work (late responses, shutdown) arrives through a locked inbox and an `eventfd`.
final class EventLoop: @unchecked Sendable {
    // @unchecked: the `var`s and `scratch` are touched only on the loop's own thread (`run` and what it calls);
    // other threads reach the loop only through `post` (the `inbox` Locked plus an `eventfd` write), the Atomics
    // `threadID` and `activeConnections`, and the immutable `settings`, `epollFD` and `wakeFD`.
    enum Message {
        case response(HTTPResponder, HTTPResponse)
        /// A handler set `onClose` from another thread.
        case closeWatch(HTTPResponder)
        /// A handler answered with a streamed body.
        case startStream(HTTPStream, HTTPResponse)
        /// A stream has bytes (or its end) to write.
        case stream(HTTPStream)
        case beginShutdown
        case stop
    }

    private static let readChunk = 64 * 1024
    private static let maxEvents = 256

    private let settings: LoopSettings
    private let epollFD: Int32
    private let wakeFD: Int32
    private var listenFD: Int32
    private var listenRegistered = false
    private var acceptResumeAt: UInt64 = 0
    private var connections: [Connection?] = []
    private var connectionCount = 0
    private var nextSerial: UInt32 = 0
    private let inbox = Locked<[Message]>([])
    private let threadID = Atomic<UInt>(0)
    /// Connections still owed work (not lingering), read by `HTTPServer.shutdown` to know when it drained.
    let activeConnections = Atomic<Int>(0)
    private var now: UInt64
    private var dateSecond = -1
    private var dateHeader: [UInt8] = []
    private var shuttingDown = false
    private var stopped = false
    private let scratch: UnsafeMutableRawBufferPointer
    private let sweepIntervalMs: UInt64

    init(listenFD: Int32, settings: LoopSettings) throws {
        self.settings = settings
        self.listenFD = listenFD
        self.epollFD = try blockingSystemCall("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) }
        do {
            self.wakeFD = try blockingSystemCall("eventfd") { eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC)) }
        } catch {
            Glibc.close(epollFD)
            throw error
        }
        self.scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: EventLoop.readChunk, alignment: 16)
        self.now = monotonicMilliseconds()
        let shortest = min(settings.timeouts.header, settings.timeouts.idle, settings.timeouts.request)
        self.sweepIntervalMs = max(10, min(1000, shortest / 4))
        try register(wakeFD, events: EPOLLIN.rawValue)
        try register(listenFD, events: EPOLLIN.rawValue)
        listenRegistered = true
        refreshDate()
    }

    deinit {
        scratch.deallocate()
        Glibc.close(epollFD)
        Glibc.close(wakeFD)
        if listenFD >= 0 { Glibc.close(listenFD) }
    }

    var inLoopThread: Bool {
        threadID.load(ordering: .relaxed) == UInt(pthread_self())
    }

    /// Hands a message to the loop from any thread.
    func post(_ message: Message) {
        let wasEmpty = inbox.withLock { box -> Bool in
            let empty = box.isEmpty
            box.append(message)
            return empty
        }
        if wasEmpty {
            var one: UInt64 = 1
            _ = try? systemCall("write") { Glibc.write(wakeFD, &one, 8) }
        }
    }

    // MARK: - The loop

    func run() {
        threadID.store(UInt(pthread_self()), ordering: .relaxed)
        assert(inLoopThread)
        var events = [epoll_event](repeating: epoll_event(), count: EventLoop.maxEvents)
        var nextSweep = now + sweepIntervalMs
        while !stopped {
            let timeout = Int32(clamping: nextSweep > now ? nextSweep - now : 0)
            let count: Int32
            do {
                switch try systemCall("epoll_wait", { epoll_wait(epollFD, &events, Int32(EventLoop.maxEvents), timeout) }) {
                case .processed(let n): count = n
                case .wouldBlock: count = 0
                }
            } catch {
                count = 0
            }
            now = monotonicMilliseconds()
            refreshDate()
            for i in 0..<Int(count) {
                let event = events[i]
                let token = event.data.u64
                let fd = Int32(bitPattern: UInt32(truncatingIfNeeded: token))
                if token >> 32 == 0 {
                    if fd == wakeFD {
                        drainInbox()
                    } else if fd == listenFD {
                        acceptConnections()
                    }
                } else if fd >= 0, Int(fd) < connections.count, let connection = connections[Int(fd)],
                          connection.token == token {
                    handle(connection, events: event.events)
                }
                if stopped { break }
            }
            if now >= nextSweep {
                sweep()
                nextSweep = now + sweepIntervalMs
            }
        }
        for case let connection? in connections {
            close(connection)
        }
    }

    private func register(_ fd: Int32, token: UInt64? = nil, events: UInt32) throws {
        var event = epoll_event()
        event.events = events
        event.data.u64 = token ?? UInt64(UInt32(bitPattern: fd))
        try blockingSystemCall("epoll_ctl") { epoll_ctl(epollFD, EPOLL_CTL_ADD, fd, &event) }
    }

    private func drainInbox() {
        var value: UInt64 = 0
        _ = try? systemCall("read") { Glibc.read(wakeFD, &value, 8) }
        let messages = inbox.withLock { box -> [Message] in
            let taken = box
            box.removeAll()
            return taken
        }
        for message in messages {
            switch message {
            case .response(let responder, let response):
                deliver(responder, response)
            case .closeWatch(let responder):
                closeWatchRequested(responder)
            case .startStream(let stream, let head):
                startStream(stream, head: head)
            case .stream(let stream):
                streamReady(stream)
            case .beginShutdown:
                beginShutdown()
            case .stop:
                stopped = true
            }
        }
    }

    // MARK: - Accepting

    private func acceptConnections() {
        for _ in 0..<128 {
            var address = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let result: IOResult<Int32>
            do {
                result = try systemCall("accept4") {
                    withUnsafeMutablePointer(to: &address) { pointer in
                        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                            accept4(listenFD, $0, &length, Int32(SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue))
                        }
                    }
                }
            } catch let error as HTTPServerError {
                if let code = error.errno, code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM {
                    // Out of descriptors: stop watching the listener for a moment instead of spinning on it.
                    pauseAccepting()
                    return
                }
                continue
            } catch {
                return
            }
            guard case .processed(let fd) = result else { return }
            if connectionCount >= settings.maxConnections || shuttingDown {
                Glibc.close(fd)
                continue
            }
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let interest = EPOLLIN.rawValue
            nextSerial = nextSerial == UInt32.max ? 1 : nextSerial + 1
            let connection = Connection(fd: fd, serial: nextSerial, limits: settings.limits, timeouts: settings.timeouts,
                                        remoteAddress: formatAddress(&address), now: now, interest: interest)
            do {
                try register(fd, token: connection.token, events: interest)
            } catch {
                Glibc.close(fd)
                continue
            }
            if Int(fd) >= connections.count {
                connections.append(contentsOf: repeatElement(nil, count: Int(fd) + 1 - connections.count + 64))
            }
            connections[Int(fd)] = connection
            connectionCount += 1
            activeConnections.add(1, ordering: .relaxed)
        }
    }

    private func pauseAccepting() {
        guard listenRegistered else { return }
        _ = epoll_ctl(epollFD, EPOLL_CTL_DEL, listenFD, nil)
        listenRegistered = false
        acceptResumeAt = now + 100
    }

    // MARK: - Connection events

    private func handle(_ connection: Connection, events: UInt32) {
        if events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 {
            close(connection)
            return
        }
        if events & EPOLLIN.rawValue != 0 {
            readable(connection)
            if connection.closed { return }
        }
        advance(connection)
    }

    private func readable(_ connection: Connection) {
        let count: Int
        do {
            switch try systemCall("read", { Glibc.read(connection.fd, scratch.baseAddress, scratch.count) }) {
            case .processed(let n): count = n
            case .wouldBlock: return
            }
        } catch {
            close(connection)
            return
        }
        if count == 0 && connection.stream != nil {
            // A client streaming a body has no request left to send here: FIN means it is gone (see `HTTPStream`).
            close(connection)
            return
        }
        if count == 0 {
            // FIN says the client sends nothing more, not that it stopped reading (`shutdown(SHUT_WR)`):
            // what it sent is still answered, however late.
            perform(connection.machine.event(.peerClosed(watched: watchesClose(connection))), on: connection)
            return
        }
        _ = connection.machine.event(.bytesReceived(now: now))
        guard connection.machine.acceptsInput else {
            return  // the framing is lost or we are closing: what the client still sends is discarded
        }
        let bytes = UnsafeRawBufferPointer(rebasing: scratch[0..<count])
        if connection.bufferedInput == 0 {
            connection.dropInput()
            let used = feed(connection, bytes)
            if used < count && !connection.closed && connection.machine.keepsInput {
                connection.inBuffer.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[used...]))
            }
        } else {
            if connection.inOffset > 0 {
                connection.inBuffer.removeFirst(connection.inOffset)
                connection.inOffset = 0
            }
            connection.inBuffer.append(contentsOf: bytes)
        }
    }

    /// Whether the pending request's handler waits to hear of a close and may be sent a `102` to find out.
    private func watchesClose(_ connection: Connection) -> Bool {
        guard let pending = connection.pending else { return false }
        return !pending.isHTTP10 && pending.wantsCloseNotice
    }

    /// Writes what is queued and parses what waits in `inBuffer`, until the connection waits for a handler,
    /// for the client to read, or for more bytes; then lets the state machine close it or sets what the loop
    /// watches it for.
    private func advance(_ connection: Connection) {
        var rounds = 0
        // Each round either parses at least one request or ends: the bound only guards against our own bugs.
        while !connection.closed && rounds < 1_000_000 {
            rounds += 1
            if connection.machine.mayParse {
                processBuffered(connection)
                if connection.closed { return }
            }
            flush(connection)
            if connection.closed { return }
            if connection.hasOutput || !connection.machine.mayParse || connection.bufferedInput == 0 {
                break
            }
        }
        perform(connection.machine.event(.settled(connection.buffers)), on: connection)
        if !connection.closed {
            updateInterest(connection)
        }
    }

    /// Does what the state machine asked.
    private func perform(_ action: ConnectionStateMachine.Action, on connection: Connection) {
        switch action {
        case .none:
            break
        case .probe:
            connection.output.append(contentsOf: EventLoop.processingResponse)
        case .answerTimeout(let message):
            // RFC 9110 §15.5.9; the connection closes after it.
            queueError(connection, status: 408, code: "request_timeout", message: message)
        case .startLingering:
            startLingering(connection)
        case .close:
            close(connection)
        }
    }

    /// Parses what waits in `inBuffer`, after a pending response was written.
    private func processBuffered(_ connection: Connection) {
        guard connection.bufferedInput > 0 else { return }
        // Taken out of the connection while handlers run, so that nothing they do can touch it mid-parse.
        let buffered = connection.inBuffer
        let start = connection.inOffset
        connection.dropInput()
        let used = buffered.withUnsafeBytes { feed(connection, UnsafeRawBufferPointer(rebasing: $0[start...])) }
        if start + used < buffered.count && !connection.closed && connection.machine.keepsInput {
            connection.inBuffer = buffered
            connection.inOffset = start + used
        }
    }

    /// Feeds bytes to the parser and dispatches requests while the state machine lets it (one waits for its
    /// response, or too many answers wait to be written).
    /// - Returns: the bytes consumed.
    private func feed(_ connection: Connection, _ bytes: UnsafeRawBufferPointer) -> Int {
        var offset = 0
        connection.processing = true
        defer { connection.processing = false }
        while offset < bytes.count && !connection.closed && connection.machine.mayParse {
            if connection.parser.isIdle {
                _ = connection.machine.event(.requestBegan(now: now))
            }
            let (used, event) = connection.parser.parse(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
            offset += used
            guard let event = event else { continue }
            switch event {
            case .continueExpected:
                connection.output.append(contentsOf: EventLoop.continueResponse)
            case .request(let parsed):
                dispatch(connection, parsed)
            case .failure(let error):
                queueError(connection, status: error.status, code: error.code, message: error.message)
            }
        }
        return offset
    }

    /// Queues an error answer that ends the connection (the request's framing is lost or its time is up).
    private func queueError(_ connection: Connection, status: Int, code: String, message: String) {
        let response = HTTPResponse.error(status: status, code: code, message: message)
        connection.output.append(response, dateHeader: dateHeader, isHead: false, keepAlive: false, http10: false)
        _ = connection.machine.event(.errorQueued)
        settings.onResponse?(nil, "", status, 0)
    }

    /// A handler set `onClose` after its request was dispatched: the client's FIN may have come first.
    func closeWatchRequested(_ responder: HTTPResponder) {
        assert(inLoopThread, "connections are touched on their own loop")
        guard let connection = responder.connection, !connection.closed, connection.pending === responder else { return }
        perform(connection.machine.event(.closeWatchRequested(watched: watchesClose(connection))), on: connection)
        if !connection.processing && !connection.closed {
            advance(connection)
        }
    }

    /// Sent after a FIN to tell a client that only half-closed from one that went away, for a handler that
    /// asked to hear of the latter (`onClose`, e.g. a long-poll): HTTP/1.1 clients must accept interim
    /// responses before the final one, while a closed socket answers one with a reset, which ends the
    /// connection and runs `onClose`.
    private static let processingResponse: [UInt8] = Array("HTTP/1.1 102 Processing\r\n\r\n".utf8)
    private static let continueResponse: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    private func dispatch(_ connection: Connection, _ parsed: ParsedRequest) {
        let start = settings.onResponse == nil ? 0 : monotonicNanoseconds()
        let responder = HTTPResponder(loop: self, connection: connection, method: parsed.request.method,
                                      isHTTP10: parsed.request.version == .http1_0, keepAlive: parsed.keepAlive, startNanoseconds: start)
        connection.pending = responder
        _ = connection.machine.event(.requestDispatched)
        settings.router.route(parsed.request, responder)
    }

    /// Writes a response on the loop thread, in order, then resumes the connection if it was waiting.
    func deliver(_ responder: HTTPResponder, _ response: HTTPResponse) {
        assert(inLoopThread, "responses are written on their connection's own loop")
        guard let connection = responder.connection, !connection.closed, connection.pending === responder else { return }
        connection.pending = nil
        var keepAlive = responder.keepAlive && !shuttingDown
        if keepAlive, let value = response.headers["Connection"], value.lowercased().contains("close") {
            keepAlive = false
        }
        let queuedBefore = connection.output.count
        connection.output.append(response, dateHeader: dateHeader, isHead: responder.isHead, keepAlive: keepAlive,
                                 http10: responder.isHTTP10)
        _ = connection.machine.event(.answerQueued(keepAlive: keepAlive, bytes: connection.output.count - queuedBefore))
        if let onResponse = settings.onResponse {
            let elapsed = monotonicNanoseconds() &- responder.startNanoseconds
            onResponse(responder.routePattern, responder.method, response.status, elapsed)
        }
        if !connection.processing {
            advance(connection)
        }
    }

    // MARK: - Streamed bodies

    /// Writes a streamed response's head, then whatever its handler wrote meanwhile.
    func startStream(_ stream: HTTPStream, head: HTTPResponse) {
        assert(inLoopThread, "streams are written on their connection's own loop")
        let responder = stream.responder
        guard let connection = stream.connection, !connection.closed, connection.pending === responder,
              connection.stream == nil else {
            stream.connectionDidClose()
            return
        }
        var keepAlive = responder.keepAlive && !shuttingDown && stream.framing == .chunked
        if keepAlive, let value = head.headers["Connection"], value.lowercased().contains("close") {
            keepAlive = false
        }
        connection.output.append(head, dateHeader: dateHeader, isHead: responder.isHead, keepAlive: keepAlive,
                                 http10: responder.isHTTP10, streamed: stream.framing)
        connection.stream = stream
        connection.streamKeepAlive = keepAlive
        if let onResponse = settings.onResponse {
            onResponse(responder.routePattern, responder.method, head.status,
                       monotonicNanoseconds() &- responder.startNanoseconds)
        }
        if responder.isHead || head.status < 200 || head.status == 204 || head.status == 304 {
            endStream(connection, stream)
        } else {
            // Bytes written before the head went out were kept for now (`streamReady` found no stream yet).
            streamReady(stream)
            return
        }
        if !connection.processing {
            advance(connection)
        }
    }

    /// Moves a stream's written bytes to its connection's output and writes them; closes a connection whose
    /// client reads too slowly.
    func streamReady(_ stream: HTTPStream) {
        assert(inLoopThread, "streams are written on their connection's own loop")
        // Before the head is out, the bytes wait in the stream (`startStream` comes back for them).
        guard let connection = stream.connection, !connection.closed, connection.stream === stream else { return }
        let (bytes, finished, overflowed) = stream.take()
        if overflowed || connection.output.count + bytes.count > stream.maxBufferedBytes {
            close(connection)
            return
        }
        connection.output.append(contentsOf: bytes)
        if finished {
            endStream(connection, stream)
        }
        if !connection.processing {
            advance(connection)
        }
    }

    private static let lastChunk: [UInt8] = Array("0\r\n\r\n".utf8)

    /// The streamed body is complete: the connection serves its next request (or closes, for HTTP/1.0).
    private func endStream(_ connection: Connection, _ stream: HTTPStream) {
        if stream.framing == .chunked && !stream.headOnly {
            connection.output.append(contentsOf: EventLoop.lastChunk)
        }
        connection.stream = nil
        connection.pending = nil
        // A stream that ends once shutdown began closes its connection, as a late answer would.
        _ = connection.machine.event(.answerQueued(keepAlive: connection.streamKeepAlive && !shuttingDown))
        if !connection.hasOutput {
            // An HTTP/1.0 body has no last chunk: when its bytes were all written before the end, no flush is left
            // to report the output drained, and the connection would wait for its idle timeout to close.
            perform(connection.machine.event(.outputDrained(now: now)), on: connection)
        }
    }

    // MARK: - Writing

    /// Bytes one connection may send per turn of the loop: a client reading a 100 MB answer as fast as loopback
    /// allows would otherwise keep the loop in `send` until all of it went out, while every other connection on
    /// the loop waits. The rest goes out on the next `EPOLLOUT`, after the others had their turn.
    static let writeBudget = 512 * 1024

    private func flush(_ connection: Connection) {
        guard connection.hasOutput else { return }
        let (outcome, written) = connection.output.send(to: connection.fd, budget: EventLoop.writeBudget)
        if written > 0 {
            _ = connection.machine.event(.outputWritten(now: now))
        }
        switch outcome {
        case .failed:
            close(connection)
        case .wouldBlock:
            settings.onWriteBlocked?()
        case .budgetSpent:
            // Usually the socket has room left and the rest goes out on the next turn; but it may be full as well,
            // as a client that does not read leaves it for good. Only an observer needs to know which.
            if let onWriteBlocked = settings.onWriteBlocked {
                var entry = pollfd(fd: connection.fd, events: Int16(POLLOUT), revents: 0)
                if poll(&entry, 1, 0) == 0 { onWriteBlocked() }
            }
        case .drained:
            perform(connection.machine.event(.outputDrained(now: now)), on: connection)
        }
    }

    /// Half-closes after the last response and drains what the client still sends, so that unread
    /// request bytes don't turn our close into a reset that destroys the response in flight.
    private func startLingering(_ connection: Connection) {
        connection.dropInput()
        if connection.countedActive {
            connection.countedActive = false
            activeConnections.subtract(1, ordering: .relaxed)
        }
        _ = Glibc.shutdown(connection.fd, Int32(SHUT_WR))
    }

    private func updateInterest(_ connection: Connection) {
        var wanted: UInt32 = 0
        if connection.machine.wantsRead(connection.buffers) { wanted |= EPOLLIN.rawValue }
        if connection.hasOutput { wanted |= EPOLLOUT.rawValue }
        if wanted == connection.interest { return }
        var event = epoll_event()
        event.events = wanted
        event.data.u64 = connection.token
        if epoll_ctl(epollFD, EPOLL_CTL_MOD, connection.fd, &event) == 0 {
            connection.interest = wanted
        } else {
            close(connection)
        }
    }

    private func close(_ connection: Connection) {
        guard !connection.closed else { return }
        connection.closed = true
        Glibc.close(connection.fd)
        if Int(connection.fd) < connections.count, connections[Int(connection.fd)] === connection {
            connections[Int(connection.fd)] = nil
        }
        connectionCount -= 1
        if connection.countedActive {
            connection.countedActive = false
            activeConnections.subtract(1, ordering: .relaxed)
        }
        connection.dropInput()
        connection.output.removeAll()
        if let stream = connection.stream {
            connection.stream = nil
            stream.connectionDidClose()
        }
        if let pending = connection.pending {
            connection.pending = nil
            pending.connectionDidClose()
        }
    }

    // MARK: - Timers

    /// The coarse timer: one pass over the connections every `sweepIntervalMs`, so that no request pays
    /// for arming or cancelling a timer.
    private func sweep() {
        if !listenRegistered && listenFD >= 0 && now >= acceptResumeAt && !shuttingDown {
            if (try? register(listenFD, events: EPOLLIN.rawValue)) != nil {
                listenRegistered = true
            }
        }
        for case let connection? in connections {
            let action = connection.machine.event(.tick(now: now, connection.buffers))
            guard action != .none else { continue }
            perform(action, on: connection)
            if !connection.closed {
                advance(connection)
            }
        }
    }

    private func refreshDate() {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME_COARSE, &ts)
        let second = ts.tv_sec
        if second == dateSecond { return }
        dateSecond = second
        dateHeader = Array("Date: \(httpDate(seconds: second))\r\n".utf8)
    }

    // MARK: - Shutdown

    private func beginShutdown() {
        guard !shuttingDown else { return }
        shuttingDown = true
        if listenFD >= 0 {
            if listenRegistered {
                _ = epoll_ctl(epollFD, EPOLL_CTL_DEL, listenFD, nil)
            }
            Glibc.close(listenFD)
            listenFD = -1
            listenRegistered = false
            settings.onListenerClosed?()
        }
        for case let connection? in connections {
            // Only connections between requests (or lingering) close: a request already begun is read to
            // its end within the grace period and answered, with `Connection: close`.
            perform(connection.machine.event(.shutdownBegan(connection.buffers)), on: connection)
        }
    }
}

/// The text of a C string held in `buffer`, up to its NUL.
private func text(upToNUL buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// Formats an IPv4/IPv6 peer address as `host:port`.
private func formatAddress(_ storage: inout sockaddr_storage) -> String {
    var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
    switch Int32(storage.ss_family) {
    case AF_INET:
        return withUnsafePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                var addr = sin.pointee.sin_addr
                inet_ntop(AF_INET, &addr, &buffer, socklen_t(buffer.count))
                return "\(text(upToNUL: buffer)):\(UInt16(bigEndian: sin.pointee.sin_port))"
            }
        }
    case AF_INET6:
        return withUnsafePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                var addr = sin6.pointee.sin6_addr
                inet_ntop(AF_INET6, &addr, &buffer, socklen_t(buffer.count))
                return "[\(text(upToNUL: buffer))]:\(UInt16(bigEndian: sin6.pointee.sin6_port))"
            }
        }
    default:
        return ""
    }
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) for the `Date` header.
func httpDate(seconds: Int) -> String {
    var time = time_t(seconds)
    var parts = tm()
    gmtime_r(&time, &parts)
    let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
    let day = days[Int(parts.tm_wday) % 7]
    let month = months[Int(parts.tm_mon) % 12]
    return "\(day), \(two(parts.tm_mday)) \(month) \(parts.tm_year + 1900) \(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
}
