#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Synchronization
import Threads

/// Writes lines to a file descriptor from a thread of its own, so that the threads that log neither wait for the
/// write nor take turns on the file's lock: at the default log level every request is a line, and a `GET` served
/// from the settled-job cache spent a third of its CPU time writing it (wrk -c64: 48,600 requests/s at `info`
/// against 63,200 at `error`, 25.7 against 17.8 µs of CPU per request, each thread's `write(2)` taking the file's
/// lock in turn).
///
/// A line is pushed onto a lock-free stack and the caller goes on; the writer takes everything pushed at once,
/// puts it back in the order it came and writes it with one `write(2)`, so lines are never interleaved or
/// reordered. Logging takes no lock: an event loop logs each answer it sends, and with the queue behind a mutex a
/// loop answering `/healthz` among other requests waited for it 132 times in 10 s, 29 of them for more than 2 ms,
/// whenever the thread that held it had been preempted (`perf` on the loops' context switches).
///
/// `write(_:waitUntilWritten:)` with `true` returns once the line and everything before it is written (warnings
/// and errors: the lines that explain a crash must not wait in memory). At most `maxQueuedBytes` wait: past that
/// a caller waits for room, as it would on a blocking `write(2)` to a pipe nobody reads. A line still queued when
/// the process is killed is lost; one queued when it exits is written (`standardError` flushes at `atexit`). If
/// the thread cannot start, each line is written by its caller.
public final class LineWriter: @unchecked Sendable {
    // @unchecked: `head`, `queuedBytes`, `writerIdle`, `waiters` and `direct` are atomics; an `Entry` is written
    // only before the compare-and-exchange that publishes it and read only after the exchange that takes it;
    // `taken`, `written`, `awaited` and `emptyTakes` are read and written only with `lock` held; `fd` never changes.

    /// The process's standard error; what is queued is written when the process exits.
    public static let standardError: LineWriter = {
        let writer = LineWriter(fd: 2)
        atexit { LineWriter.standardError.flush(waitingAtMostMs: 5_000) }
        return writer
    }()

    /// Bytes that may wait unwritten before callers wait for room: 1 MiB for standard error.
    let maxQueuedBytes: Int
    /// Lines that come within this long of each other share one `write(2)`, unless a caller waits for them.
    static let gatherMs = 1

    /// One queued line; `next`, the line pushed before it, is owned by this entry (retained once, by its push).
    private final class Entry {
        let line: [UInt8]
        var next: Unmanaged<Entry>?
        init(_ line: [UInt8]) { self.line = line }
    }

    private let fd: Int32
    /// The line pushed last, or nil: the stack the writer takes whole.
    private let head = Atomic<Unmanaged<Entry>?>(nil)
    /// Bytes pushed and not yet written.
    private let queuedBytes = Atomic<Int>(0)
    /// The writer waits on `wakeup` for a first line: the caller that pushes one signals it.
    private let writerIdle = Atomic<Bool>(false)
    /// Callers waiting for their lines to be written, or for room: the writer then neither idles nor gathers.
    private let waiters = Atomic<Int>(0)
    /// No writer thread: callers write their lines themselves.
    private let direct = Atomic<Bool>(false)
    /// Wakes the writer. Only a wake-up: what it finds is ordered by the atomics and by `lock`.
    private let wakeup = DispatchSemaphore(value: 0)
    /// Held by the writer while it takes the stack and when it has written it, and by callers that wait.
    private let lock = Lock()
    /// Times the writer took the stack, and the last of those takes that is written: a caller that pushed its
    /// line with the lock held while `taken` was n waits for `written` to reach n + 1.
    private var taken: Int64 = 0
    private var written: Int64 = 0
    /// The highest take a caller waits to see written (`waitForWritten(after:)`), with the lock: while `written` is
    /// past it, callers still waiting need nothing more of the writer, which may then sleep until a line comes.
    private var awaited: Int64 = -1
    /// Takes that found no line, with the lock: each one a caller waited for (`flush` with nothing queued).
    private var emptyTakes: Int64 = 0
    /// Called (with the lock held) each time a caller starts to wait for room: tests see the bound work.
    private let onWaitForRoom: (@Sendable () -> Void)?

    /// A writer of `fd`, with its thread started.
    init(fd: Int32, maxQueuedBytes: Int = 1 << 20, onWaitForRoom: (@Sendable () -> Void)? = nil) {
        self.fd = fd
        self.maxQueuedBytes = maxQueuedBytes
        self.onWaitForRoom = onWaitForRoom
        do {
            _ = try startThread(name: "log-writer") { [self] in run() }
        } catch {
            direct.store(true, ordering: .releasing)
        }
    }

    deinit {
        var next = head.exchange(nil, ordering: .acquiring)
        while let entry = next?.takeRetainedValue() { next = entry.next }
    }

    /// Queues `line` (whole lines, with their newline); with `waitUntilWritten`, returns once it is written.
    public func write(_ line: [UInt8], waitUntilWritten: Bool = false) {
        if direct.load(ordering: .acquiring) { return Self.writeFully(fd, line) }
        if waitUntilWritten {
            lock.withLock {
                push(line)
                waitForWritten(after: taken, deadline: nil)
            }
            return
        }
        push(line)
        if writerIdle.load(ordering: .sequentiallyConsistent),
           writerIdle.exchange(false, ordering: .sequentiallyConsistent) {
            wakeup.signal()
        }
        if queuedBytes.load(ordering: .relaxed) > maxQueuedBytes { lock.withLock { waitForRoom() } }
    }

    /// Waits until everything queued so far is written, or `milliseconds` have passed.
    public func flush(waitingAtMostMs milliseconds: Int64) {
        if direct.load(ordering: .acquiring) { return }
        lock.withLock { waitForWritten(after: taken, deadline: Timestamp.monotonicMs() + milliseconds) }
    }

    /// Runs `body` with the writer's lock held: tests show that logging a line does not take it.
    func whileLocked(_ body: () -> Void) {
        lock.withLock(body)
    }

    /// Pushes `line` onto the stack. Sequentially consistent, as the writer's look at the stack after it declares
    /// itself idle is: either the writer sees the line, or the caller sees the writer idle and wakes it.
    private func push(_ line: [UInt8]) {
        let entry = Entry(line)
        let pushed = Unmanaged.passRetained(entry)
        var expected = head.load(ordering: .relaxed)
        while true {
            entry.next = expected
            let (exchanged, found) = head.compareExchange(
                expected: expected, desired: pushed, successOrdering: .sequentiallyConsistent,
                failureOrdering: .relaxed)
            if exchanged { break }
            expected = found
        }
        queuedBytes.add(line.count, ordering: .relaxed)
    }

    /// With `lock` held: wakes the writer, which then takes the stack without gathering, and waits until the
    /// take after `round` is written (or the deadline passes).
    private func waitForWritten(after round: Int64, deadline: Int64?) {
        waiters.add(1, ordering: .sequentiallyConsistent)
        defer { waiters.subtract(1, ordering: .relaxed) }
        awaited = max(awaited, round)
        wakeup.signal()
        while written <= round && !direct.load(ordering: .relaxed) {
            guard let deadline else {
                lock.wait()
                continue
            }
            let left = deadline - Timestamp.monotonicMs()
            if left <= 0 { return }
            lock.wait(milliseconds: left)
        }
    }

    /// With `lock` held: waits while more than `maxQueuedBytes` wait to be written.
    private func waitForRoom() {
        while queuedBytes.load(ordering: .relaxed) > maxQueuedBytes {
            onWaitForRoom?()
            waiters.add(1, ordering: .sequentiallyConsistent)
            wakeup.signal()
            lock.wait()
            waiters.subtract(1, ordering: .relaxed)
        }
    }

    private func run() {
        var batch: [UInt8] = []
        var lines: [[UInt8]] = []
        while true {
            waitForLines()
            if waiters.load(ordering: .relaxed) == 0 { _ = wakeup.wait(timeout: .now() + .milliseconds(Self.gatherMs)) }
            let (first, round) = lock.withLock { () -> (Unmanaged<Entry>?, Int64) in
                taken += 1
                let first = head.exchange(nil, ordering: .acquiring)
                if first == nil { emptyTakes += 1 }
                return (first, taken)
            }
            // The stack holds the newest line first.
            var next = first
            while let entry = next?.takeRetainedValue() {
                lines.append(entry.line)
                next = entry.next
            }
            for line in lines.reversed() { batch.append(contentsOf: line) }
            lines.removeAll(keepingCapacity: true)
            Self.writeFully(fd, batch)
            lock.withLock {
                queuedBytes.subtract(batch.count, ordering: .relaxed)
                written = round
                if waiters.load(ordering: .relaxed) > 0 { lock.broadcast() }
            }
            batch.removeAll(keepingCapacity: true)
        }
    }

    /// Returns once a line is pushed or somebody waits for a take not yet written. Declares the writer idle, then
    /// looks at the stack once more: a caller that pushed before the look is seen, one that pushed after it sees the
    /// writer idle. A caller that waits signals `wakeup` once it has said which take it waits for.
    ///
    /// A caller still waiting for what is written already is not waited for: it has been woken and is on its way
    /// out. Going round for it, the writer took and wrote nothing, over and over, until that caller's thread ran:
    /// 7,300 to 20,200 empty takes for 800 lines written by four threads that each waited for its own (three runs
    /// of `testTheWriterTakesTheStackOnlyForWhatItsCallersWaitFor`), where none is needed.
    private func waitForLines() {
        while head.load(ordering: .sequentiallyConsistent) == nil && !takeAwaited() {
            writerIdle.store(true, ordering: .sequentiallyConsistent)
            if head.load(ordering: .sequentiallyConsistent) == nil && !takeAwaited() {
                _ = wakeup.wait(timeout: .now() + .seconds(60))
            }
            writerIdle.store(false, ordering: .sequentiallyConsistent)
        }
    }

    /// Whether a caller waits for a take that is not written yet.
    private func takeAwaited() -> Bool {
        guard waiters.load(ordering: .sequentiallyConsistent) > 0 else { return false }
        return lock.withLock { awaited >= written }
    }

    /// How many takes found no line: one for each `flush` made with nothing queued, and no more (tests).
    var takesWithoutLines: Int64 { lock.withLock { emptyTakes } }

    /// `write(2)` until every byte is written or the descriptor refuses them: a short write goes on, an
    /// interrupted one is tried again, a full non-blocking one waits for room; any other error drops the rest.
    private static func writeFully(_ fd: Int32, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { raw in
            guard var next = raw.baseAddress else { return }
            var left = raw.count
            while left > 0 {
                let n = systemWrite(fd, next, left)
                if n > 0 {
                    next += n
                    left -= n
                } else if n < 0 && errno == EINTR {
                    continue
                } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                    var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                    if poll(&ready, 1, 1_000) <= 0 { return }
                } else {
                    return
                }
            }
        }
    }
}

#if canImport(Glibc)
private let systemWrite = Glibc.write
#elseif canImport(Darwin)
private let systemWrite = Darwin.write
#endif
