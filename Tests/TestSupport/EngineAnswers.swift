import Foundation
import JobCore

/// Blocking reads over the engine's asynchronous entry points, for tests (never on an event loop).
extension Engine {
    /// Starts `start` and waits (at most 10 s) for the value it passes on.
    public func answer<T>(_ what: String, _ start: (@escaping @Sendable (T) -> Void) -> Void) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let slot = AnswerSlot<T>()
        start { value in
            slot.value = value
            done.signal()
        }
        guard done.wait(timeout: .now() + 10) == .success, let value = slot.value else {
            throw UpstreamError("no answer for \(what) within 10 s")
        }
        return value
    }
}

/// The value handed from the thread that answers to the one that waits.
private final class AnswerSlot<T>: @unchecked Sendable {
    // @unchecked: written once, before the semaphore is signalled, and read only after the wait for it returned.
    var value: T?
}
