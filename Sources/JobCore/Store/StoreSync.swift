#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Threads

/// The store's queues and pools wait on the project's one lock type (with its condition variable). Held only to
/// move values in and out of a queue or pool.
typealias StoreMonitor = Lock

/// The answer to one queued write, handed from the writer thread to the caller
/// waiting for it. The semaphore orders the writer's store of `result` before
/// the caller's read.
final class WriteTicket<Value>: @unchecked Sendable {
    // @unchecked: `result` is written once by the writer before `done.signal()` and read by the waiter only after
    // `done.wait()` (or by the writer itself, in `onComplete`); `onComplete` is immutable.
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

/// A dedicated OS thread (the store's writer blocks in fsync, PostgreSQL's lease keeper on the network; neither may
/// sit on a shared pool).
final class StoreThread: @unchecked Sendable {
    // @unchecked: `thread` is set in `init` and cleared by `join`, which only its owner calls, once: a store's
    // `close` (only the one caller that flips its `closed` flag reaches it) or the lease keeper's `stop`.
    private var thread: pthread_t?

    /// The writer handles values nested up to `Limits.storedJSONDepth`, and Swift releases (and encodes) a nested
    /// `JSONValue` recursively, one frame per level. A fixed stack keeps that from depending on `ulimit -s`
    /// (glibc gives a new thread 8 MiB by default, 2 MiB when the limit is unlimited) and leaves room for
    /// AddressSanitizer's larger frames, under which 8 MiB overflowed. Only the pages touched are committed.
    static let stackSize = 64 << 20

    /// How many nice steps below the thread that opens the store its writer runs. The writer commits whatever has
    /// queued in one transaction, so when the CPU is short it loses little by waiting: it makes fewer, larger
    /// commits, and the fetcher and the engine's queue, whose every delay holds up a transfer or a job, go first.
    /// Submissions, which wait for their commit, slow down with it, and the work already accepted is finished
    /// before more is taken.
    /// With a core to spare it changes nothing. See docs/architecture.md for what it was measured to gain.
    /// Batches of state changes alone, which nobody waits on, go lower still: idle priority (`WriteQueue`).
    static let writerNiceIncrement: Int32 = 10

    /// Starts `body` on a new thread named `name`, `niceIncrement` nice steps below the calling thread.
    /// - Throws: `StoreError` if the thread cannot be created.
    init(name: String, niceIncrement: Int32 = 0, _ body: @escaping () -> Void) throws {
        do throws(ThreadStartError) {
            thread = try startThread(
                name: name, stackSize: StoreThread.stackSize, niceIncrement: niceIncrement, body)
        } catch {
            throw StoreError(.io, "cannot start the store's \(name) thread (errno \(error.errno))")
        }
    }

    /// Waits for the thread to end; once.
    func join() {
        guard let thread else { return }
        self.thread = nil
        pthread_join(thread, nil)
    }
}
