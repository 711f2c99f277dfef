import CHTTPLinux
import Glibc
import Synchronization
import Threads

/// Settings of an `HTTPServer`; the defaults suit production.
public struct HTTPServerConfiguration: Sendable {
    /// The address to bind: an IPv4 or IPv6 literal, or `localhost`.
    public var host = "0.0.0.0"
    /// The port to bind; 0 picks any free port (`start()` returns it).
    public var port = 8080
    /// A larger request body is refused with 413 before it is read.
    public var maxRequestBodyBytes = 1 << 20
    /// Request line plus headers above this size are refused with 431.
    public var maxHeaderBytes = 16 * 1024
    /// A request target above this size is refused with 414.
    public var maxTargetBytes = 8 * 1024
    /// Time allowed to receive a whole request head (and between body bytes); then `408` and the connection closes.
    public var headerTimeoutSeconds = 10.0
    /// Time allowed to receive a whole request, head and body, however steadily its bytes arrive; then `408`
    /// and the connection closes.
    public var requestTimeoutSeconds = 30.0
    /// Time a keep-alive connection may sit idle between requests (or blocked on writing) before it closes.
    public var idleTimeoutSeconds = 60.0
    /// Event-loop threads; each accepts, reads and writes its own connections.
    public var eventLoopCount = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    /// Connections above this count are closed as soon as they are accepted (the budget is split evenly
    /// across the event loops, each of which accepts on its own socket).
    public var maxConnections = 10_000
    /// Called as each response is queued on its connection, before its first byte is written: route pattern (or nil
    /// when unmatched), method, status, duration in ns. Runs on an event loop: keep it short.
    public var onResponse: (@Sendable (String?, String, Int, UInt64) -> Void)? = nil
    /// Called when a connection's answers wait for its client to read: the socket's buffer is full and the rest
    /// waits. The connection reads no further requests until its output drains, so with a client that never
    /// reads, this is when the connection stops for good. Runs on an event loop: keep it short.
    public var onWriteBlocked: (@Sendable () -> Void)? = nil
    /// Called on each event loop as it closes its listening socket, when a shutdown begins; once every loop has,
    /// new connections are refused. Runs on an event loop: keep it short.
    public var onListenerClosed: (@Sendable () -> Void)? = nil

    /// The defaults.
    public init() {}
}

/// A raw-socket HTTP/1.1 server: non-blocking sockets, `epoll`, one event-loop thread per core.
///
/// Handlers run on the loop that read their request and must never block it (no sleeping, no
/// waiting on locks held long, no synchronous I/O): hand slow work to another thread and answer
/// through `HTTPResponder.send` when it is done.
public final class HTTPServer: @unchecked Sendable {
    // @unchecked: `phase` is a Locked; `loops` and `threads` are written by `start` and read by `beginShutdown` /
    // `shutdown`, which run after `start` returned (a stop from another thread is ordered by `phase`'s lock,
    // taken after `start` released it); the rest is immutable.
    private enum Phase {
        case idle
        case running
        case shuttingDown
        case stopped
    }

    private let configuration: HTTPServerConfiguration
    private let router: Router
    private let phase = Locked(Phase.idle)
    private var loops: [EventLoop] = []
    private var threads: [pthread_t] = []

    /// A server for `router`, not listening yet.
    public init(configuration: HTTPServerConfiguration, router: Router) {
        self.configuration = configuration
        self.router = router
    }

    /// Binds, listens, starts the loops.
    /// - Returns: the bound port.
    /// - Throws: `HTTPServerError` when the address is invalid or a socket call fails.
    public func start() throws -> Int {
        try phase.withLock { phase in
            guard case .idle = phase else {
                throw HTTPServerError(kind: .invalidState, call: nil, errno: nil, message: "the server was already started")
            }
            phase = .running
        }
        // A body kept in a file goes out by `sendfile`, which has no `MSG_NOSIGNAL`: a peer gone meanwhile must fail
        // the call (`EPIPE`), not end the process.
        signal(SIGPIPE, SIG_IGN)
        let count = max(1, configuration.eventLoopCount)
        var sockets: [Int32] = []
        var port = configuration.port
        do {
            if port != 0 {
                // SO_REUSEPORT would let us join a listener another process already has on this port
                // (same user) and silently share its traffic: probe with a plain socket first.
                Glibc.close(try makeListeningSocket(port: port, reusePort: false, listening: false))
            }
            for _ in 0..<count {
                let fd = try makeListeningSocket(port: port, reusePort: true, listening: true)
                sockets.append(fd)
                if port == 0 {
                    port = try boundPort(fd)
                }
            }
            let settings = LoopSettings(
                limits: HTTPParserLimits(maxHeaderBytes: configuration.maxHeaderBytes,
                                         maxTargetBytes: configuration.maxTargetBytes,
                                         maxBodyBytes: configuration.maxRequestBodyBytes),
                timeouts: ConnectionStateMachine.Timeouts(
                    header: UInt64(max(0.001, configuration.headerTimeoutSeconds) * 1000),
                    request: UInt64(max(0.001, configuration.requestTimeoutSeconds) * 1000),
                    idle: UInt64(max(0.001, configuration.idleTimeoutSeconds) * 1000)),
                maxConnections: (configuration.maxConnections + count - 1) / count,
                onResponse: configuration.onResponse,
                onWriteBlocked: configuration.onWriteBlocked,
                onListenerClosed: configuration.onListenerClosed,
                router: router)
            var created: [EventLoop] = []
            for fd in sockets {
                created.append(try EventLoop(listenFD: fd, settings: settings))
            }
            sockets.removeAll()
            loops = created
        } catch {
            for fd in sockets { Glibc.close(fd) }
            phase.withLock { $0 = .stopped }
            throw error
        }
        for (index, loop) in loops.enumerated() {
            do throws(ThreadStartError) {
                threads.append(
                    try startThread(name: "http-loop-\(index)", sliceMicroseconds: Self.loopSliceMicroseconds) {
                        loop.run()
                    })
            } catch {
                throw HTTPServerError.systemCall(error.call, errno: error.errno)
            }
        }
        return port
    }

    /// The time slice each event loop asks the kernel for (`requestCurrentThreadTimeSlice`), the shortest it
    /// grants. A loop wakes for each request and is done with it in microseconds; with the default slice (0.7 ms
    /// times 1 + log2 of the CPUs: 1.4 ms on two) a loop that woke on CPUs kept busy by other work (the server's
    /// reads, clients, neighbours) could wait out the running thread's slice. With the short slice it goes first;
    /// its share of the CPU is unchanged. See docs/architecture.md for what it was measured to gain.
    static let loopSliceMicroseconds = 100

    /// Stops accepting and closes idle connections; responses in flight still complete.
    public func beginShutdown() {
        let proceed = phase.withLock { phase -> Bool in
            guard case .running = phase else { return false }
            phase = .shuttingDown
            return true
        }
        guard proceed else { return }
        for loop in loops {
            loop.post(.beginShutdown)
        }
    }

    /// Waits until all in-flight responses are written or the timeout passes, then closes everything
    /// and stops the loops.
    /// - Parameter gracePeriodSeconds: the longest time to wait for responses in flight.
    /// - Returns: true if everything drained within the grace period.
    public func shutdown(gracePeriodSeconds: Double) -> Bool {
        beginShutdown()
        let proceed = phase.withLock { phase -> Bool in
            guard case .shuttingDown = phase else {
                if case .idle = phase { phase = .stopped }
                return false
            }
            phase = .stopped
            return true
        }
        guard proceed else { return true }
        let deadline = monotonicNanoseconds() + UInt64(max(0, gracePeriodSeconds) * 1_000_000_000)
        var drained = false
        while true {
            if loops.allSatisfy({ $0.activeConnections.load(ordering: .relaxed) <= 0 }) {
                drained = true
                break
            }
            if monotonicNanoseconds() >= deadline { break }
            usleep(2_000)
        }
        for loop in loops {
            loop.post(.stop)
        }
        for thread in threads {
            pthread_join(thread, nil)
        }
        threads.removeAll()
        loops.removeAll()
        return drained
    }

    private func makeListeningSocket(port: Int, reusePort: Bool, listening: Bool) throws -> Int32 {
        guard (0...65535).contains(port) else {
            throw HTTPServerError(kind: .invalidAddress, call: nil, errno: nil, message: "port \(port) out of range")
        }
        let host = configuration.host == "localhost" ? "127.0.0.1" : configuration.host
        var v4 = sockaddr_in()
        var v6 = sockaddr_in6()
        let family: Int32
        if inet_pton(AF_INET, host, &v4.sin_addr) == 1 {
            family = AF_INET
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = UInt16(port).bigEndian
        } else if inet_pton(AF_INET6, host, &v6.sin6_addr) == 1 {
            family = AF_INET6
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = UInt16(port).bigEndian
        } else {
            throw HTTPServerError(kind: .invalidAddress, call: nil, errno: nil,
                                  message: "host \(configuration.host) is not an IP address")
        }
        let fd = try blockingSystemCall("socket") {
            socket(family, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        }
        do {
            var one: Int32 = 1
            let size = socklen_t(MemoryLayout<Int32>.size)
            try blockingSystemCall("setsockopt") { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size) }
            if reusePort {
                // Each loop listens on its own socket; the kernel spreads new connections across them.
                try blockingSystemCall("setsockopt") { setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, size) }
            }
            if family == AF_INET {
                try blockingSystemCall("bind") {
                    withUnsafePointer(to: &v4) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                        }
                    }
                }
            } else {
                try blockingSystemCall("bind") {
                    withUnsafePointer(to: &v6) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                        }
                    }
                }
            }
            if listening {
                try blockingSystemCall("listen") { listen(fd, 4096) }
            }
        } catch {
            Glibc.close(fd)
            throw error
        }
        return fd
    }

    private func boundPort(_ fd: Int32) throws -> Int {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        try blockingSystemCall("getsockname") {
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
        }
        let family = Int32(storage.ss_family)
        return withUnsafePointer(to: &storage) { pointer in
            if family == AF_INET6 {
                return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    Int(UInt16(bigEndian: $0.pointee.sin6_port))
                }
            }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                Int(UInt16(bigEndian: $0.pointee.sin_port))
            }
        }
    }
}
