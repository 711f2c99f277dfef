import Dispatch
import Threads

/// Frees large answer bodies away from the event loops.
///
/// Freeing a body of many megabytes returns its pages to the kernel (`munmap`), which takes time in proportion to
/// its size: the last reference to a 170 MB `nodes?include=result` answer, dropped on the loop that sent it, held
/// that loop in `munmap` for 18 ms while `/healthz` and every other connection on it waited. A connection hands a
/// sent (or dropped) large body here instead, and it is freed on a background queue.
final class BodyReleaser: Sendable {
    /// Bodies at least this large are freed here; smaller ones cost less to free than to hand over.
    static let threshold = 1 << 20

    static let shared = BodyReleaser()

    private let doomed = Locked<[[UInt8]]>([])
    private let queue: DispatchQueue
    /// Where the bodies end: dropped (the default), or shown to a test.
    private let dispose: @Sendable ([[UInt8]]) -> Void

    /// `.utility` rather than `.background`: the bodies' memory is held until the queue runs, so it must not
    /// starve behind every other thread of a busy machine (on Linux, the engine's reads run on `.utility`
    /// workers too, five nice steps below the process).
    init(qos: DispatchQoS = .utility, dispose: @escaping @Sendable ([[UInt8]]) -> Void = { _ in }) {
        self.queue = DispatchQueue(label: "http.body-release", qos: qos)
        self.dispose = dispose
    }

    /// Takes `bytes` over, leaving it empty, and frees it on the background queue.
    ///
    /// The caller's array gives up its reference inside the lock, right after the list took one: the queue, which
    /// needs the lock to take the list, always holds the last reference, so the storage is freed there and never
    /// on the caller's thread (unless someone else still holds the body, e.g. a cache, and frees it later).
    func release(_ bytes: inout [UInt8]) {
        let first = doomed.withLock { list -> Bool in
            list.append(bytes)
            bytes = []
            return list.count == 1
        }
        // One drain per batch: the drain takes every body queued until it runs.
        if first {
            queue.async { [self] in
                let taken = doomed.withLock { list -> [[UInt8]] in
                    let taken = list
                    list = []
                    return taken
                }
                dispose(taken)
            }
        }
    }

    /// Hands `bytes` over if it is large enough to be worth it; smaller arrays are left to the caller.
    func releaseIfLarge(_ bytes: inout [UInt8]) {
        if bytes.count >= Self.threshold {
            release(&bytes)
        }
    }
}
