import Foundation
import JobCore

/// Blocking reads over the engine's asynchronous entry points, for tests (never on an event loop).
extension Engine {
    /// Starts `start` and waits (at most 10 s) for the value it passes on.
    public func answer<T>(_ what: String, _ start: (@escaping @Sendable (T) -> Void) -> Void) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let box = Box<T?>(nil)
        start { value in
            box.value = value
            done.signal()
        }
        guard done.wait(timeout: .now() + 10) == .success, let value = box.value else {
            throw UpstreamError("no answer for \(what) within 10 s")
        }
        return value
    }
}

/// A value handed between threads in tests.
public final class Box<T>: @unchecked Sendable {
    // @unchecked: the tests hand `value` between threads with a semaphore, an expectation or a lock that orders
    // each write before the reads after it (but one read, which asserts that no write happened yet).
    public var value: T
    public init(_ value: T) { self.value = value }
}
