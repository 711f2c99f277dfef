#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch

/// A mutex with one condition variable, private to the store. Held only to
/// move values in and out of a queue or pool.
final class StoreMonitor: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }
    /// Waits for a signal; call with the lock held.
    func wait() { pthread_cond_wait(condition, mutex) }
    func signal() { pthread_cond_signal(condition) }

    /// Waits for a signal or until `milliseconds` have passed; call with the lock held.
    func wait(milliseconds: Int64) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let total = Int64(now.tv_nsec) + (milliseconds % 1000) * 1_000_000
        var deadline = timespec()
        deadline.tv_sec = now.tv_sec + Int(milliseconds / 1000) + Int(total / 1_000_000_000)
        deadline.tv_nsec = Int(total % 1_000_000_000)
        pthread_cond_timedwait(condition, mutex, &deadline)
    }

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// The answer to one queued write, handed from the writer thread to the caller
/// waiting for it. The semaphore orders the writer's store of `result` before
/// the caller's read.
final class WriteTicket<Value>: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private var result: Result<Value, StoreError>?
    /// Set at creation and only read by the writer afterwards, so it needs no lock.
    private let onComplete: (@Sendable (Result<Value, StoreError>) -> Void)?

    /// A ticket to `wait()` for, or one whose answer goes to `onComplete` on the writer thread.
    init(onComplete: (@Sendable (Result<Value, StoreError>) -> Void)? = nil) {
        self.onComplete = onComplete
    }

    /// Called once, by the writer.
    func complete(_ result: Result<Value, StoreError>) {
        self.result = result
        done.signal()
        onComplete?(result)
    }

    /// Blocks until the writer completed the ticket.
    func wait() throws -> Value {
        done.wait()
        switch result {
        case .success(let value): return value
        case .failure(let error): throw error
        case .none: throw StoreError(.io, "write finished without an answer")
        }
    }
}

/// A dedicated OS thread (the store's writer blocks in fsync; it must not sit on a shared pool).
final class StoreThread: @unchecked Sendable {
    private final class Box {
        let body: () -> Void
        init(_ body: @escaping () -> Void) { self.body = body }
    }

    private var thread: pthread_t?

    /// Starts `body` on a new thread.
    /// - Throws: `StoreError` if the thread cannot be created.
    init(_ body: @escaping () -> Void) throws {
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        #if canImport(Glibc)
        var handle = pthread_t()
        #else
        var handle: pthread_t?
        #endif
        let rc = pthread_create(&handle, nil, { raw in
            guard let raw else { return nil }
            Unmanaged<Box>.fromOpaque(raw).takeRetainedValue().body()
            return nil
        }, box)
        guard rc == 0 else {
            Unmanaged<Box>.fromOpaque(box).release()
            throw StoreError(.io, "cannot start the store writer thread (errno \(rc))")
        }
        thread = handle
    }

    /// Waits for the thread to end; once.
    func join() {
        guard let thread else { return }
        self.thread = nil
        pthread_join(thread, nil)
    }
}
