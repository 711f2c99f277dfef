import Dispatch

/// Something scheduled that can be called off.
public protocol Cancellable: AnyObject {
    /// Calls it off; does nothing if it already ran or was cancelled.
    func cancel()
}

/// Runs work after a delay: the clock behind `Deferred.timeout`, injectable so tests use `ManualScheduler`.
public protocol DeferredScheduler: AnyObject {
    /// Runs `work` once after `milliseconds`, on the scheduler's executor, unless cancelled.
    func schedule(afterMilliseconds milliseconds: Int, _ work: @escaping () -> Void) -> Cancellable
}

/// A test clock: nothing runs until `advance(byMilliseconds:)`. Single-threaded, like the Deferreds it drives.
public final class ManualScheduler: DeferredScheduler {
    private final class Entry: Cancellable {
        let due: Int
        let sequence: Int
        var work: (() -> Void)?

        init(due: Int, sequence: Int, work: @escaping () -> Void) {
            self.due = due
            self.sequence = sequence
            self.work = work
        }

        func cancel() {
            work = nil  // dropped from the queue on the next advance
        }
    }

    private var entries: [Entry] = []
    private var nextSequence = 0

    /// The clock's current time, starting at 0.
    public private(set) var nowMilliseconds = 0

    /// Creates a clock at time 0 with nothing scheduled.
    public init() {}

    /// Number of scheduled pieces of work that have neither run nor been cancelled.
    public var pendingCount: Int {
        entries.reduce(0) { $0 + ($1.work == nil ? 0 : 1) }
    }

    /// Schedules `work` at `nowMilliseconds + milliseconds` (a negative delay counts as 0).
    public func schedule(afterMilliseconds milliseconds: Int, _ work: @escaping () -> Void) -> Cancellable {
        let entry = Entry(due: nowMilliseconds + max(0, milliseconds), sequence: nextSequence, work: work)
        nextSequence += 1
        entries.append(entry)
        return entry
    }

    /// Moves the clock forward, running the work that falls due in time order (ties in scheduling
    /// order), including work scheduled by that work if it falls due within the advance.
    public func advance(byMilliseconds milliseconds: Int) {
        let target = nowMilliseconds + max(0, milliseconds)
        while true {
            entries.removeAll { $0.work == nil }
            var earliest: Int?
            for (index, entry) in entries.enumerated() where entry.due <= target {
                if let best = earliest {
                    let other = entries[best]
                    if (entry.due, entry.sequence) < (other.due, other.sequence) {
                        earliest = index
                    }
                } else {
                    earliest = index
                }
            }
            guard let index = earliest else { break }
            let entry = entries.remove(at: index)
            nowMilliseconds = max(nowMilliseconds, entry.due)
            let work = entry.work
            entry.work = nil
            work?()
        }
        nowMilliseconds = target
    }
}

/// Schedules work on a dispatch queue. Give it the serial queue the Deferreds live on.
public final class DispatchQueueScheduler: DeferredScheduler {
    private final class Token: Cancellable {
        let item: DispatchWorkItem

        init(_ item: DispatchWorkItem) {
            self.item = item
        }

        func cancel() {
            item.cancel()
        }
    }

    private let queue: DispatchQueue

    /// Schedules on `queue`.
    public init(queue: DispatchQueue) {
        self.queue = queue
    }

    /// Runs `work` on the queue after `milliseconds` unless the returned token is cancelled first.
    public func schedule(afterMilliseconds milliseconds: Int, _ work: @escaping () -> Void) -> Cancellable {
        let item = DispatchWorkItem(block: work)
        queue.asyncAfter(deadline: .now() + .milliseconds(max(0, milliseconds)), execute: item)
        return Token(item)
    }
}
