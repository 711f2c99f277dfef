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
        weak var scheduler: ManualScheduler?

        init(due: Int, sequence: Int, work: @escaping () -> Void, scheduler: ManualScheduler) {
            self.due = due
            self.sequence = sequence
            self.work = work
            self.scheduler = scheduler
        }

        /// Earlier due time first; among equal due times, the one scheduled first.
        func runsBefore(_ other: Entry) -> Bool {
            (due, sequence) < (other.due, other.sequence)
        }

        func cancel() {
            guard work != nil else { return }
            work = nil  // the heap drops it when it reaches the top
            scheduler?.pendingCount -= 1
        }
    }

    /// A binary min-heap by `runsBefore`, so that engines with many timers stay fast under test.
    private var heap: [Entry] = []
    private var nextSequence = 0

    /// The clock's current time, starting at 0.
    public private(set) var nowMilliseconds = 0

    /// Number of scheduled pieces of work that have neither run nor been cancelled.
    public private(set) var pendingCount = 0

    /// Creates a clock at time 0 with nothing scheduled.
    public init() {}

    /// Schedules `work` at `nowMilliseconds + milliseconds` (a negative delay counts as 0).
    public func schedule(afterMilliseconds milliseconds: Int, _ work: @escaping () -> Void) -> Cancellable {
        let entry = Entry(due: nowMilliseconds + max(0, milliseconds), sequence: nextSequence, work: work, scheduler: self)
        nextSequence += 1
        pendingCount += 1
        push(entry)
        return entry
    }

    /// Moves the clock forward, running the work that falls due in time order (ties in scheduling
    /// order), including work scheduled by that work if it falls due within the advance.
    /// Work that keeps scheduling work with no delay keeps this call running.
    public func advance(byMilliseconds milliseconds: Int) {
        let target = nowMilliseconds + max(0, milliseconds)
        while let first = heap.first, first.due <= target {
            popFirst()
            guard let work = first.work else { continue }  // cancelled
            first.work = nil
            pendingCount -= 1
            nowMilliseconds = max(nowMilliseconds, first.due)
            work()
        }
        nowMilliseconds = target
    }

    private func push(_ entry: Entry) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].runsBefore(heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private func popFirst() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count && heap[left].runsBefore(heap[smallest]) { smallest = left }
            if right < heap.count && heap[right].runsBefore(heap[smallest]) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
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
