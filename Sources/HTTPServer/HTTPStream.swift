import Threads

/// A response whose body is written over time, e.g. Server-Sent Events: the head goes out at once, each `write`
/// later, from any thread, and `finish` ends it. Nothing is held per stream but its buffer: no thread waits.
///
/// HTTP/1.1 bodies are sent chunked (the connection stays usable after `finish`); HTTP/1.0 ones end with the
/// connection. Memory is bounded: bytes the client has not read yet count against `maxBufferedBytes`, and a write
/// past it closes the connection (a client that does not read loses its stream rather than the server its memory).
/// A client that sends FIN ends the stream too: it has no request left to send on this connection, and this way
/// it is let go at once rather than at the next write.
public final class HTTPStream: @unchecked Sendable {
    // @unchecked: `state` is a Locked; `loop`, `connection` and `framing` are immutable and the connection is touched
    // only on its loop's thread (in `EventLoop.streamReady` and friends).
    struct State {
        /// Framed bytes written and not handed to the loop yet.
        var pending: [UInt8] = []
        /// A message to the loop is on its way; later writes ride on it.
        var scheduled = false
        var finished = false
        /// Closed: by the client, by an overflow, or by the server; writes are refused.
        var closed = false
        var overflowed = false
        var onClose: (@Sendable () -> Void)?
    }

    let state = Locked(State())
    let loop: EventLoop?
    let connection: Connection?
    let responder: HTTPResponder
    let framing: StreamFraming
    /// The largest number of bytes written and not yet read by the client.
    public let maxBufferedBytes: Int
    /// Only the head is sent (a `HEAD` request): every write is refused.
    let headOnly: Bool

    init(responder: HTTPResponder, framing: StreamFraming, maxBufferedBytes: Int) {
        self.responder = responder
        self.loop = responder.loop
        self.connection = responder.connection
        self.framing = framing
        self.maxBufferedBytes = max(1024, maxBufferedBytes)
        self.headOnly = responder.isHead
    }

    /// Queues `bytes` for the client.
    /// - Returns: false when the stream is closed (the client went away, it read too slowly, or `finish` was
    ///   called); the bytes are dropped.
    @discardableResult
    public func write(_ bytes: [UInt8]) -> Bool {
        guard !bytes.isEmpty else { return isOpen }
        let (accepted, post) = state.withLock { state -> (Bool, Bool) in
            if state.closed || state.finished || state.overflowed || headOnly { return (false, false) }
            let framedCount = bytes.count + (framing == .chunked ? 12 : 0)
            if state.pending.count + framedCount > maxBufferedBytes {
                state.overflowed = true
                state.pending = []
                let post = !state.scheduled
                state.scheduled = true
                return (false, post)
            }
            if framing == .chunked {
                appendHex(bytes.count, to: &state.pending)
                state.pending.append(0x0D)
                state.pending.append(0x0A)
                state.pending.append(contentsOf: bytes)
                state.pending.append(0x0D)
                state.pending.append(0x0A)
            } else {
                state.pending.append(contentsOf: bytes)
            }
            let post = !state.scheduled
            state.scheduled = true
            return (true, post)
        }
        if post { schedule() }
        return accepted
    }

    /// Ends the body after what was written; later writes are refused.
    public func finish() {
        let post = state.withLock { state -> Bool in
            if state.closed || state.finished { return false }
            state.finished = true
            let post = !state.scheduled
            state.scheduled = true
            return post
        }
        if post { schedule() }
    }

    /// Whether writes are still taken.
    public var isOpen: Bool {
        state.withLock { !$0.closed && !$0.finished && !$0.overflowed }
    }

    /// Called once, on some thread, when the stream closes before `finish`: the client went away or read too
    /// slowly. Set after that happened, it is called at once.
    public var onClose: (@Sendable () -> Void)? {
        get { state.withLock { $0.onClose } }
        set {
            let callNow = state.withLock { state -> Bool in
                if state.closed && !state.finished { return true }
                state.onClose = newValue
                return false
            }
            if callNow { newValue?() }
        }
    }

    private func schedule() {
        guard let loop else { return }
        if loop.inLoopThread {
            loop.streamReady(self)
        } else {
            loop.post(.stream(self))
        }
    }

    /// What the loop takes for the client: the bytes written since, whether the body ends, whether it overflowed.
    func take() -> (bytes: [UInt8], finished: Bool, overflowed: Bool) {
        state.withLock { state in
            state.scheduled = false
            let bytes = state.pending
            state.pending = []
            return (bytes, state.finished, state.overflowed)
        }
    }

    /// The connection closed: refuse writes and tell the handler, unless the body had ended.
    func connectionDidClose() {
        let callback = state.withLock { state -> (@Sendable () -> Void)? in
            if state.closed { return nil }
            state.closed = true
            state.pending = []
            let callback = state.finished ? nil : state.onClose
            state.onClose = nil
            return callback
        }
        callback?()
    }
}

private func appendHex(_ value: Int, to out: inout [UInt8]) {
    let digits: [UInt8] = Array("0123456789abcdef".utf8)
    var started = false
    for shift in stride(from: 60, through: 0, by: -4) {
        let digit = (value >> shift) & 0xF
        if digit != 0 || started || shift == 0 {
            started = true
            out.append(digits[digit])
        }
    }
}

extension HTTPResponder {
    /// Answers with a streamed body: `head` (status and headers; its body is ignored) goes out now, the body through
    /// the returned stream. Counts as this request's answer: a later `send` is ignored.
    /// - Parameter maxBufferedBytes: how many written bytes may wait for a slow client before its connection closes.
    /// - Returns: the stream; closed already if the connection was.
    public func startStream(_ head: HTTPResponse, maxBufferedBytes: Int = 256 * 1024) -> HTTPStream {
        let stream = HTTPStream(responder: self, framing: isHTTP10 ? .untilClose : .chunked,
                                maxBufferedBytes: maxBufferedBytes)
        guard claimForStream() else {
            stream.connectionDidClose()
            return stream
        }
        guard let loop else {
            // A stand-alone responder (tests of handlers): the head goes to `onSend`, the body nowhere.
            sendHeadOnly(head)
            return stream
        }
        if loop.inLoopThread {
            loop.startStream(stream, head: head)
        } else {
            loop.post(.startStream(stream, head))
        }
        return stream
    }
}
