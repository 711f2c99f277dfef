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

    private let doomed = Locked<(bodies: [[UInt8]], owners: [any AnyObject & Sendable])>(([], []))
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

    /// Takes `bytes` and its `owner` (`HTTPResponse.bodyOwner`) over, leaving both empty, and frees them on the
    /// background queue.
    ///
    /// The caller gives up its references inside the lock, right after the list took them: the queue, which needs
    /// the lock to take the list, always holds the last reference, so the storage is freed there and never on the
    /// caller's thread (unless someone else still holds the body, e.g. a cache, and frees it later). The owner goes
    /// with the body: an owner let go of first, on the caller's thread, would free there a body it held alone.
    func release(_ bytes: inout [UInt8], owner: inout (any AnyObject & Sendable)?) {
        let first = doomed.withLock { list -> Bool in
            list.bodies.append(bytes)
            bytes = []
            if let kept = owner { list.owners.append(kept) }
            owner = nil
            return list.bodies.count == 1
        }
        // One drain per batch: the drain takes every body queued until it runs.
        if first {
            queue.async { [self] in
                let taken = doomed.withLock { list in
                    defer { list = ([], []) }
                    return list
                }
                dispose(taken.bodies)
            }
        }
    }

    /// Hands `bytes` (and its owner) over if it is large enough to be worth it; smaller arrays are left to the
    /// caller.
    func releaseIfLarge(_ bytes: inout [UInt8], owner: inout (any AnyObject & Sendable)?) {
        if bytes.count >= Self.threshold {
            release(&bytes, owner: &owner)
        }
    }
}
