import Glibc

/// An error of the HTTP server: a kind, a readable message and, for failed system calls, the call and `errno`.
public struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    /// What went wrong, broadly.
    public enum Kind: Sendable, Equatable {
        /// A system call failed; `call` and `errno` say which and why.
        case systemCall
        /// The configured host is not an IPv4 or IPv6 address literal.
        case invalidAddress
        /// `start()` was called twice, or after shutdown.
        case invalidState
    }

    /// What went wrong, broadly.
    public let kind: Kind
    /// The failed system call's name, for `.systemCall`.
    public let call: String?
    /// The `errno` the call left, for `.systemCall`.
    public let errno: Int32?
    /// A readable explanation.
    public let message: String

    /// A readable description including the call and `errno` when known.
    public var description: String {
        if let call = call, let errno = errno {
            return "\(call) failed: \(message) (errno \(errno))"
        }
        return message
    }

    static func systemCall(_ call: String, errno: Int32) -> HTTPServerError {
        HTTPServerError(kind: .systemCall, call: call, errno: errno, message: String(cString: strerror(errno)))
    }
}

/// The outcome of a non-blocking system call: done, or it would have blocked.
enum IOResult<T> {
    case processed(T)
    case wouldBlock
}

/// Runs one system call: retries `EINTR`, reports `EAGAIN`/`EWOULDBLOCK` as `.wouldBlock`,
/// and throws an error with `errno` and the call's name for every other failure.
@inline(__always)
func systemCall<T: FixedWidthInteger>(_ name: StaticString, _ body: () -> T) throws -> IOResult<T> {
    while true {
        let result = body()
        if result >= 0 {
            return .processed(result)
        }
        let code = Glibc.errno
        if code == EINTR {
            continue
        }
        if code == EAGAIN || code == EWOULDBLOCK {
            return .wouldBlock
        }
        throw HTTPServerError.systemCall("\(name)", errno: code)
    }
}

/// Like `systemCall`, for calls that may not block (setup calls): `EAGAIN` is an error too.
@inline(__always)
@discardableResult
func blockingSystemCall<T: FixedWidthInteger>(_ name: StaticString, _ body: () -> T) throws -> T {
    switch try systemCall(name, body) {
    case .processed(let value):
        return value
    case .wouldBlock:
        throw HTTPServerError.systemCall("\(name)", errno: EAGAIN)
    }
}

/// Monotonic milliseconds from the coarse clock: read through the vDSO, no real system call.
@inline(__always)
func monotonicMilliseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return UInt64(ts.tv_sec) &* 1000 &+ UInt64(ts.tv_nsec / 1_000_000)
}

/// Precise monotonic nanoseconds, for response durations.
@inline(__always)
func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}
