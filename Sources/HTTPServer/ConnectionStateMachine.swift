/// The lifecycle of one connection as a value: the event loop reports what happened (a request began,
/// bytes arrived, an answer was queued or written, the client sent FIN, the clock moved) and does the
/// action returned. The loop owns the socket, the buffers and the parser; this owns the decisions about
/// reading, time limits, lingering and closing, so that they are tested without sockets and with any clock.
struct ConnectionStateMachine {
    /// The time limits, in milliseconds.
    struct Timeouts: Equatable {
        /// For a whole request head, and between two bytes of a body.
        var header: UInt64
        /// For a whole request, head and body, however steadily its bytes arrive.
        var request: UInt64
        /// Between requests on a kept-alive connection, and for a blocked write to make progress.
        var idle: UInt64
        /// Draining what the client still sends after our side shut down.
        var linger: UInt64 = 2000
        /// The same after a `408`: the client had its time.
        var lingerAfterTimeout: UInt64 = 500
    }

    /// What the loop sees of the connection's parser and buffers when it reports an event.
    struct Buffers: Equatable {
        /// No byte of a next request has been parsed.
        var parserIdle: Bool
        /// The parser is inside a request body.
        var readingBody: Bool
        /// Bytes wait to be written.
        var hasOutput: Bool
        /// Bytes received and not parsed yet.
        var bufferedInput: Int
    }

    enum Event {
        /// The parser saw the first byte of a request.
        case requestBegan(now: UInt64)
        /// Bytes arrived from the client.
        case bytesReceived(now: UInt64)
        /// A complete request went to its handler.
        case requestDispatched
        /// The pending request's answer was queued (`bytes` of it: head and body); without keep-alive it is the
        /// last one.
        case answerQueued(keepAlive: Bool, bytes: Int = 0)
        /// An error answer that ends the connection was queued (a bad request or a timeout).
        case errorQueued
        /// Some queued bytes were written.
        case outputWritten(now: UInt64)
        /// Every queued byte is written.
        case outputDrained(now: UInt64)
        /// The client sent FIN. `watched`: the pending request's handler wants to hear of a close and can be
        /// sent an interim response (HTTP/1.1).
        case peerClosed(watched: Bool)
        /// The pending request's handler asked to hear of a close after the request was dispatched.
        case closeWatchRequested(watched: Bool)
        /// The timer sweep.
        case tick(now: UInt64, Buffers)
        /// The loop wrote and parsed all it could for now.
        case settled(Buffers)
        /// The server stops: connections with nothing begun close.
        case shutdownBegan(Buffers)
    }

    enum Action: Equatable {
        case none
        /// Queue `102 Processing`: a client that closed entirely answers it with a reset.
        case probe
        /// Queue `408` with this message, then report `errorQueued`.
        case answerTimeout(message: String)
        /// Shut our side down (`SHUT_WR`) and drain what the client still sends.
        case startLingering
        case close
    }

    private enum State: Equatable {
        /// Reading requests and writing answers.
        case open
        /// The client sent FIN: what it sent is answered, then the connection closes.
        case halfClosed
        /// The last answer is queued: write it, then linger.
        case closing
        /// The last answer is queued and the client sent FIN: write it, then close.
        case closingHalfClosed
        /// Our side is shut down; what the client still sends is drained until the deadline.
        case lingering(deadline: UInt64)
        case closed
    }

    /// Requests parsed whose answers are not written out yet: past this, parsing (and so reading) waits for
    /// the client to read, so that a client that pipelines and never reads costs a bounded amount of memory.
    static let maxAnswersInFlight = 16
    /// The same bound in bytes: once this much of the answers is unwritten, the next request waits for the client
    /// to read them all. A connection so holds at most one large answer (a settled job of 60 MB, asked for 16
    /// times in one write, would otherwise be made and held 16 times over).
    static let maxAnswerBytesInFlight = 1 << 20
    /// Received bytes not parsed yet above which reading stops (requests wait behind a pending one).
    static let maxBacklog = 64 * 1024

    private let timeouts: Timeouts
    private var state = State.open
    private var headStart: UInt64
    private var lastActivity: UInt64
    private var requestsServed = 0
    /// Answers queued since the output was last written out whole, and their bytes.
    private var answersInFlight = 0
    private var answerBytesInFlight = 0
    private var probeSent = false
    private var timedOut = false
    /// A request was dispatched and its answer is not queued yet; later requests wait behind it.
    private(set) var awaitsAnswer = false

    /// A connection accepted at `now`.
    init(timeouts: Timeouts, now: UInt64) {
        self.timeouts = timeouts
        self.headStart = now
        self.lastActivity = now
    }

    /// Bytes read are parsed; otherwise (lingering, closing) they are discarded.
    var acceptsInput: Bool { state == .open }

    /// Received bytes are still to be parsed, now or later; false once the last answer is queued.
    var keepsInput: Bool { state == .open || state == .halfClosed }

    /// Whether the parser may be fed now: no answer pending, not too many unwritten (by count or bytes), not
    /// closing.
    var mayParse: Bool {
        !awaitsAnswer && answersInFlight < Self.maxAnswersInFlight
            && answerBytesInFlight < Self.maxAnswerBytesInFlight && keepsInput
    }

    /// Our side is shut down and the connection waits to close.
    var isLingering: Bool {
        if case .lingering = state { return true }
        return false
    }

    var isClosed: Bool { state == .closed }

    /// Whether the loop should watch for bytes from the client: never while output waits for the client to
    /// read (backpressure), after the client's FIN, or once the last answer is queued.
    func wantsRead(_ buffers: Buffers) -> Bool {
        switch state {
        case .lingering: return true
        case .open: return !buffers.hasOutput && buffers.bufferedInput < Self.maxBacklog
        default: return false
        }
    }

    mutating func event(_ event: Event) -> Action {
        switch event {
        case .requestBegan(let now):
            headStart = now
        case .bytesReceived(let now), .outputWritten(let now):
            lastActivity = now
        case .requestDispatched:
            precondition(!awaitsAnswer, "invalid state: a request dispatched while another awaits its answer")
            awaitsAnswer = true
            probeSent = false
        case .answerQueued(let keepAlive, let bytes):
            awaitsAnswer = false
            answersInFlight += 1
            answerBytesInFlight += bytes
            requestsServed += 1
            if !keepAlive { beginClosing() }
        case .errorQueued:
            answersInFlight += 1
            beginClosing()
        case .outputDrained(let now):
            answersInFlight = 0
            answerBytesInFlight = 0
            switch state {
            case .closing where !awaitsAnswer:
                state = .lingering(deadline: now + (timedOut ? timeouts.lingerAfterTimeout : timeouts.linger))
                return .startLingering
            case .closingHalfClosed where !awaitsAnswer:
                state = .closed
                return .close
            default:
                break
            }
        case .peerClosed(let watched):
            switch state {
            case .lingering:
                state = .closed
                return .close
            case .open:
                state = .halfClosed
            case .closing:
                state = .closingHalfClosed
            case .halfClosed, .closingHalfClosed, .closed:
                break
            }
            return probeIfWatched(watched)
        case .closeWatchRequested(let watched):
            if state == .halfClosed || state == .closingHalfClosed {
                return probeIfWatched(watched)
            }
        case .tick(let now, let buffers):
            return tick(now: now, buffers)
        case .settled(let buffers):
            if state == .halfClosed && !awaitsAnswer && !buffers.hasOutput {
                // Nothing more can arrive (a request cut short by the FIN never completes) and nothing is owed.
                state = .closed
                return .close
            }
        case .shutdownBegan(let buffers):
            // A request already begun (even half its head) is still read and answered.
            if isLingering || (!awaitsAnswer && !buffers.hasOutput && buffers.parserIdle && buffers.bufferedInput == 0) {
                state = .closed
                return .close
            }
        }
        return .none
    }

    /// When the connection times out as things stand; nil while a handler works on its answer.
    func deadline(_ buffers: Buffers) -> UInt64? {
        switch state {
        case .lingering(let deadline): return deadline
        case .closed: return nil
        default: break
        }
        if buffers.hasOutput { return lastActivity + timeouts.idle }
        if awaitsAnswer { return nil }
        if buffers.parserIdle && buffers.bufferedInput == 0 {
            return requestsServed == 0 ? headStart + timeouts.header : lastActivity + timeouts.idle
        }
        let whole = headStart + timeouts.request
        if buffers.readingBody {
            return min(lastActivity + timeouts.header, whole)
        }
        return min(headStart + timeouts.header, whole)
    }

    private mutating func beginClosing() {
        switch state {
        case .open: state = .closing
        case .halfClosed: state = .closingHalfClosed
        default: break
        }
    }

    private mutating func probeIfWatched(_ watched: Bool) -> Action {
        guard awaitsAnswer && watched && !probeSent else { return .none }
        probeSent = true
        return .probe
    }

    private mutating func tick(now: UInt64, _ buffers: Buffers) -> Action {
        guard let deadline = deadline(buffers), now >= deadline else { return .none }
        let midRequest = !buffers.hasOutput && !awaitsAnswer && !(buffers.parserIdle && buffers.bufferedInput == 0)
        guard state == .open && midRequest else {
            // Between requests, lingering, or blocked on a client that does not read: close without a word.
            state = .closed
            return .close
        }
        timedOut = true
        let message: String
        if now >= headStart + timeouts.request {
            message = "request not received within \(Self.describe(timeouts.request))"
        } else if buffers.readingBody {
            message = "no request body bytes for \(Self.describe(timeouts.header))"
        } else {
            message = "request head not received within \(Self.describe(timeouts.header))"
        }
        return .answerTimeout(message: message)
    }

    private static func describe(_ milliseconds: UInt64) -> String {
        milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }
}
