#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Threads

/// Writes lines to a file descriptor from a thread of its own, so that the threads that log neither wait for the
/// write nor take turns on the file's lock: at the default log level every request is a line, and a `GET` served
/// from the settled-job cache spent a third of its CPU time writing it (wrk -c64: 48,600 requests/s at `info`
/// against 63,200 at `error`, 25.7 against 17.8 µs of CPU per request, each thread's `write(2)` taking the file's
/// lock in turn).
///
/// A line is copied into the queue and the caller goes on; the writer takes everything queued at once and writes
/// it with one `write(2)`, so lines are never interleaved or reordered. `write(_:waitUntilWritten:)` with `true`
/// returns once the line and everything before it is written (warnings and errors: the lines that explain a crash
/// must not wait in memory). At most `maxQueuedBytes` wait: past that a caller waits for room, as it would on a
/// blocking `write(2)` to a pipe nobody reads. A line still queued when the process is killed is lost; one queued
/// when it exits is written (`standardError` flushes at `atexit`). If the thread cannot start, each line is written
/// by its caller.
public final class LineWriter: @unchecked Sendable {
    // @unchecked: every `var` below is read and written only with `lock` held; `fd` never changes.
    // A `Lock` and its condition rather than a `Watched`, which wakes its waiters on every change: a version on one
    // woke the writer for every line and served 43,000 `GET`s a second against 48,600 with each thread writing its
    // own; here a line wakes the writer only when it went idle, or when somebody waits for the line.

    /// The process's standard error; what is queued is written when the process exits.
    public static let standardError: LineWriter = {
        let writer = LineWriter(fd: 2)
        atexit { LineWriter.standardError.flush(waitingAtMostMs: 5_000) }
        return writer
    }()

    /// Bytes that may wait unwritten before callers wait for room: 1 MiB for standard error.
    let maxQueuedBytes: Int
    /// Lines that come within this long of each other share one `write(2)`, unless a caller waits for them.
    static let gatherMs: Int64 = 1

    private let fd: Int32
    private let lock = Lock()
    private var bytes: [UInt8] = []
    /// Bytes queued and bytes written since the start: a caller waits for `written` to pass its line's end.
    private var queued: Int64 = 0
    private var written: Int64 = 0
    /// The writer waits for a first line: the caller that queues it wakes the writer.
    private var writerIdle = false
    /// Callers waiting for their lines to be written; for room in the queue.
    private var waitingForWrite = 0
    private var waitingForRoom = 0
    /// No writer thread: callers write their lines themselves.
    private var direct = false
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
            lock.withLock { direct = true }
        }
    }

    /// Queues `line` (whole lines, with their newline); with `waitUntilWritten`, returns once it is written.
    public func write(_ line: [UInt8], waitUntilWritten: Bool = false) {
        lock.lock()
        while !direct && bytes.count >= maxQueuedBytes {
            onWaitForRoom?()
            waitingForRoom += 1
            lock.wait()
            waitingForRoom -= 1
        }
        if direct {
            lock.unlock()
            return Self.writeFully(fd, line)
        }
        let wakeWriter = bytes.isEmpty && writerIdle
        bytes.append(contentsOf: line)
        queued += Int64(line.count)
        if waitUntilWritten {
            waitForWritten(queued, deadline: nil)
        } else if wakeWriter {
            lock.broadcast()
        }
        lock.unlock()
    }

    /// Waits until everything queued so far is written, or `milliseconds` have passed.
    public func flush(waitingAtMostMs milliseconds: Int64) {
        lock.withLock { waitForWritten(queued, deadline: Timestamp.monotonicMs() + milliseconds) }
    }

    /// With `lock` held: wakes the writer, which then writes at once, and waits for `end` to be written.
    private func waitForWritten(_ end: Int64, deadline: Int64?) {
        waitingForWrite += 1
        defer { waitingForWrite -= 1 }
        lock.broadcast()
        while written < end && !direct {
            guard let deadline else {
                lock.wait()
                continue
            }
            let left = deadline - Timestamp.monotonicMs()
            if left <= 0 { return }
            lock.wait(milliseconds: left)
        }
    }

    private func run() {
        var batch: [UInt8] = []
        lock.lock()
        while true {
            while bytes.isEmpty {
                writerIdle = true
                lock.wait(milliseconds: 60_000)
                writerIdle = false
            }
            if waitingForWrite == 0 && waitingForRoom == 0 { lock.wait(milliseconds: Self.gatherMs) }
            // The queue's buffer and the writer's trade places: each keeps its capacity.
            swap(&batch, &bytes)
            lock.unlock()
            Self.writeFully(fd, batch)
            lock.lock()
            written += Int64(batch.count)
            batch.removeAll(keepingCapacity: true)
            if waitingForWrite > 0 || waitingForRoom > 0 { lock.broadcast() }
        }
    }

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
