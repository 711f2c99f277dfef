#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The project's one lock: a `pthread_mutex_t` with one condition variable.
///
/// Plain pthread calls because ThreadSanitizer intercepts them. Under `Synchronization.Mutex` the suite showed
/// false races on the event loop's inbox on this toolchain: a contended `Mutex` waits in the Synchronization
/// library's futex path, which is not instrumented, so TSan can miss the ordering it gives.
/// Held only for a few instructions, to move values in or out; never across a callback, I/O or a wait on
/// another lock.
public final class Lock: @unchecked Sendable {
    // @unchecked: the two pointers are set once in `init` and freed in `deinit`; everything else goes through
    // the pthread calls, which are the synchronisation themselves.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    public init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }

    public func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }

    /// Waits for a signal; call with the lock held.
    public func wait() { pthread_cond_wait(condition, mutex) }

    /// Waits for a signal or until `milliseconds` have passed; call with the lock held.
    public func wait(milliseconds: Int64) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let total = Int64(now.tv_nsec) + (milliseconds % 1000) * 1_000_000
        var deadline = timespec()
        deadline.tv_sec = now.tv_sec + Int(milliseconds / 1000) + Int(total / 1_000_000_000)
        deadline.tv_nsec = Int(total % 1_000_000_000)
        pthread_cond_timedwait(condition, mutex, &deadline)
    }

    /// Wakes one waiter.
    public func signal() { pthread_cond_signal(condition) }
    /// Wakes every waiter.
    public func broadcast() { pthread_cond_broadcast(condition) }
}

/// A value reachable only with its `Lock` held: the drop-in for `Synchronization.Mutex<Value>`.
public final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is read and written only inside `withLock`, with `lock` held. Like `Mutex`'s, the value
    // need not be `Sendable`: it is taken `sending` (as `Mutex` takes it), so the compiler refuses a value the caller
    // still holds a reference to, and a `body` that leaves in it something the caller can still reach. It does not
    // see a reference into the value handed out as `body`'s result: callers take out copies (every `Locked` here
    // holds value types and `Sendable` references).
    private let lock = Lock()
    private var value: Value

    public init(_ value: sending Value) { self.value = value }

    public func withLock<T>(_ body: (inout sending Value) throws -> sending T) rethrows -> sending T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// A `Locked` value whose changes can be waited for: every `withLock` wakes the threads in `wait(milliseconds:until:)`,
/// which then look at the value again. For a value some thread needs to see reach a state (a store's health coming
/// back, a count of waiters), where polling it would be a guess at when to look.
public final class Watched<Value>: @unchecked Sendable {
    // @unchecked: `value` is read and written only with `lock` held, as in `Locked`.
    private let lock = Lock()
    private var value: Value

    public init(_ value: sending Value) { self.value = value }

    public func withLock<T>(_ body: (inout sending Value) throws -> sending T) rethrows -> sending T {
        lock.lock()
        defer {
            lock.broadcast()
            lock.unlock()
        }
        return try body(&value)
    }

    /// Waits until `accept` holds for the value, for at most `milliseconds`; the answer is whether it held. `accept`
    /// runs with the lock held, at once and after each change.
    public func wait(milliseconds: Int64, until accept: (Value) -> Bool) -> Bool {
        let deadline = monotonicMilliseconds() + milliseconds
        lock.lock()
        defer { lock.unlock() }
        while !accept(value) {
            let left = deadline - monotonicMilliseconds()
            if left <= 0 { return false }
            lock.wait(milliseconds: left)
        }
        return true
    }
}

/// Calls `start` with a completion and blocks the calling thread until some thread calls it, then returns what it was
/// given: for callers that may block (tests, tools) over an API that answers through a completion.
public func waitForCompletion<Value: Sendable>(_ start: (@escaping @Sendable (Value) -> Void) -> Void) -> Value {
    let answer = Watched<Value?>(nil)
    start { value in answer.withLock { $0 = value } }
    while true {
        var given: Value?
        _ = answer.wait(milliseconds: 60_000) { value in
            given = value
            return value != nil
        }
        if let given { return given }
    }
}

private func monotonicMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}
