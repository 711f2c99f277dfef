import Threads

/// Completes one request's response, from any thread, exactly once (later calls are ignored).
///
/// Handlers run on the event loop that read the request and must not block it. A handler may call
/// `send` before returning, or keep the responder and call `send` later from any thread (the loop is
/// woken and writes the response). While a response is pending, later pipelined requests on the same
/// connection wait, so responses always leave in request order.
public final class HTTPResponder: @unchecked Sendable {
    // @unchecked: `state` is a Locked; `routePattern` is set on the loop thread before the handler runs and read
    // there when writing; every other stored property is immutable.
    private struct State {
        var done = false
        var connectionClosed = false
        var closeNotified = false
        var onClose: (@Sendable () -> Void)?
    }

    private let state = Locked(State())
    /// The loop and connection this responder answers on; nil for a stand-alone responder.
    let loop: EventLoop?
    let connection: Connection?
    private let sink: (@Sendable (HTTPResponse) -> Void)?
    let isHead: Bool
    let keepAlive: Bool
    let isHTTP10: Bool
    let method: String
    let startNanoseconds: UInt64
    /// Set by the router on the loop thread before the handler runs; read on the loop when writing.
    var routePattern: String?

    init(loop: EventLoop, connection: Connection, method: String, isHTTP10: Bool, keepAlive: Bool,
         startNanoseconds: UInt64) {
        self.isHTTP10 = isHTTP10
        self.loop = loop
        self.connection = connection
        self.sink = nil
        self.method = method
        self.isHead = method == "HEAD"
        self.keepAlive = keepAlive
        self.startNanoseconds = startNanoseconds
    }

    /// A responder not bound to a connection: `send` hands the response to `onSend`.
    /// Useful to call a `Router` or a handler directly in tests.
    public init(onSend: @escaping @Sendable (HTTPResponse) -> Void) {
        self.loop = nil
        self.connection = nil
        self.sink = onSend
        self.isHTTP10 = false
        self.method = ""
        self.isHead = false
        self.keepAlive = true
        self.startNanoseconds = 0
    }

    /// Sends the response. Only the first call counts; calls after the connection closed are ignored.
    public func send(_ response: HTTPResponse) {
        let first = state.withLock { state -> Bool in
            if state.done || state.connectionClosed { return false }
            state.done = true
            state.onClose = nil
            return true
        }
        guard first else { return }
        if let sink = sink {
            sink(response)
            return
        }
        guard let loop = loop else { return }
        if loop.inLoopThread {
            loop.deliver(self, response)
        } else {
            loop.post(.response(self, response))
        }
    }

    /// Marks the answer given, for a stream; false if it was given already or the connection closed.
    func claimForStream() -> Bool {
        state.withLock { state in
            if state.done || state.connectionClosed { return false }
            state.done = true
            state.onClose = nil
            return true
        }
    }

    /// A stand-alone responder's stream: its head goes to `onSend`.
    func sendHeadOnly(_ head: HTTPResponse) {
        sink?(head)
    }

    /// Called at most once, on some thread, if the connection closes before `send` — so a long-poll can
    /// stop waiting. Set after the connection already closed, it is called at once.
    ///
    /// A client that only half-closed (`shutdown(SHUT_WR)` after its request) is still answered; to tell
    /// it from one that went away, the server then sends it a `102 Processing` interim response, which only
    /// a closed socket refuses.
    public var onClose: (@Sendable () -> Void)? {
        get { state.withLock { $0.onClose } }
        set {
            let (callNow, watching) = state.withLock { state -> (Bool, Bool) in
                if state.done || state.closeNotified { return (false, false) }
                if state.connectionClosed {
                    state.closeNotified = newValue != nil
                    return (true, false)
                }
                state.onClose = newValue
                return (false, newValue != nil)
            }
            if callNow { newValue?() }
            if watching, let loop = loop {
                // The client's FIN may have come before anyone asked to hear of a close.
                if loop.inLoopThread {
                    loop.closeWatchRequested(self)
                } else {
                    loop.post(.closeWatch(self))
                }
            }
        }
    }

    /// Whether a handler waits to hear of the connection closing before the response.
    var wantsCloseNotice: Bool {
        state.withLock { !$0.done && $0.onClose != nil }
    }

    /// Whether the connection closed before a response was sent.
    public var isConnectionClosed: Bool {
        state.withLock { $0.connectionClosed && !$0.done }
    }

    /// The loop saw the connection close: runs `onClose` once if no response was sent.
    func connectionDidClose() {
        let callback = state.withLock { state -> (@Sendable () -> Void)? in
            if state.done || state.connectionClosed { return nil }
            state.connectionClosed = true
            let callback = state.onClose
            state.onClose = nil
            state.closeNotified = callback != nil
            return callback
        }
        callback?()
    }
}
