import Synchronization

/// At most `limit` pieces of work in flight, and at most `weightLimit` of their weight, the rest waiting in arrival
/// order, and no thread held by any of them.
///
/// `enter` runs its work at once while there is room for it and none waits before it, on the calling thread;
/// otherwise the work waits, and runs on the thread of the `release` that makes room for it. Each piece of work is
/// handed its `release`, to call once, when it is done (however later, on whatever thread); a second call does
/// nothing. A piece heavier than `weightLimit` runs once no other weight is in flight.
public final class Admission: Sendable {
    private struct Waiting {
        var weight: Int
        var work: @Sendable (Release) -> Void
    }

    private struct State {
        var inFlight = 0
        var weight = 0
        var waiting: [Waiting] = []
        /// Where `waiting` starts: taken from the front without moving the rest.
        var head = 0

        func fits(_ weight: Int, limit: Int, weightLimit: Int) -> Bool {
            guard inFlight < limit else { return false }
            return weightLimit == 0 || self.weight == 0 || self.weight + weight <= weightLimit
        }

        mutating func admit(_ weight: Int) {
            inFlight += 1
            self.weight += weight
        }

        /// The first waiting piece, if it fits now; taken from the queue and counted in.
        mutating func takeNext(limit: Int, weightLimit: Int) -> Waiting? {
            guard head < waiting.count, fits(waiting[head].weight, limit: limit, weightLimit: weightLimit) else {
                return nil
            }
            let next = waiting[head]
            head += 1
            if head == waiting.count {
                waiting.removeAll(keepingCapacity: waiting.count <= 64)
                head = 0
            } else if head >= 64, head * 2 >= waiting.count {
                waiting.removeFirst(head)
                head = 0
            }
            admit(next.weight)
            return next
        }
    }

    public let limit: Int
    /// 0: weight is not bounded.
    public let weightLimit: Int
    private let state = Locked(State())

    public init(limit: Int, weightLimit: Int = 0) {
        self.limit = Swift.max(1, limit)
        self.weightLimit = Swift.max(0, weightLimit)
    }

    /// Work in flight, and work waiting for its turn.
    public var counts: (inFlight: Int, waiting: Int) {
        state.withLock { ($0.inFlight, $0.waiting.count - $0.head) }
    }

    /// The weight of the work in flight.
    public var weightInFlight: Int { state.withLock { $0.weight } }

    /// `weight`: what the work counts against `weightLimit` until it is released (0 or more).
    public func enter(weight: Int = 0, _ work: @escaping @Sendable (Release) -> Void) {
        let weight = Swift.max(0, weight)
        let admitted = state.withLock { state -> Bool in
            guard state.head == state.waiting.count, state.fits(weight, limit: limit, weightLimit: weightLimit) else {
                state.waiting.append(Waiting(weight: weight, work: work))
                return false
            }
            state.admit(weight)
            return true
        }
        if admitted { work(Release(self, weight: weight)) }
    }

    /// One piece of work of `weight` is done: the waiting pieces that now fit run here, in arrival order.
    fileprivate func leave(weight: Int) {
        var next = state.withLock { state -> Waiting? in
            state.inFlight -= 1
            state.weight -= weight
            return state.takeNext(limit: limit, weightLimit: weightLimit)
        }
        while let admitted = next {
            admitted.work(Release(self, weight: admitted.weight))
            next = state.withLock { $0.takeNext(limit: limit, weightLimit: weightLimit) }
        }
    }

    /// The right to one place in flight; `callAsFunction` gives it back.
    public final class Release: Sendable {
        private let admission: Admission
        private let weight: Int
        /// Set by the first call; an atomic flag rather than a `Locked`, which would cost a mutex per piece of work.
        private let released = Atomic<Bool>(false)

        fileprivate init(_ admission: Admission, weight: Int) {
            self.admission = admission
            self.weight = weight
        }

        public func callAsFunction() {
            if !released.exchange(true, ordering: .acquiringAndReleasing) { admission.leave(weight: weight) }
        }
    }
}
