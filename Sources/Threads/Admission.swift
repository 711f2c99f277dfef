import Synchronization

/// At most `limit` pieces of work in flight, the rest waiting in arrival order, and no thread held by any of them.
///
/// `enter` runs its work at once while fewer than `limit` are in flight, on the calling thread; otherwise the work
/// waits, and runs on the thread of the `release` that makes room for it. Each piece of work is handed its
/// `release`, to call once, when it is done (however later, on whatever thread); a second call does nothing.
public final class Admission: Sendable {
    private struct State {
        var inFlight = 0
        var waiting: [@Sendable (Release) -> Void] = []
        /// Where `waiting` starts: taken from the front without moving the rest.
        var head = 0
    }

    public let limit: Int
    private let state = Locked(State())

    public init(limit: Int) {
        self.limit = Swift.max(1, limit)
    }

    /// Work in flight, and work waiting for its turn.
    public var counts: (inFlight: Int, waiting: Int) {
        state.withLock { ($0.inFlight, $0.waiting.count - $0.head) }
    }

    public func enter(_ work: @escaping @Sendable (Release) -> Void) {
        let admitted = state.withLock { state -> Bool in
            guard state.inFlight < limit else {
                state.waiting.append(work)
                return false
            }
            state.inFlight += 1
            return true
        }
        if admitted { work(Release(self)) }
    }

    /// One piece of work is done: the next waiting one runs here, in its place, or the count falls.
    fileprivate func leave() {
        let next = state.withLock { state -> (@Sendable (Release) -> Void)? in
            guard state.head < state.waiting.count else {
                state.inFlight -= 1
                return nil
            }
            let next = state.waiting[state.head]
            state.head += 1
            if state.head == state.waiting.count {
                state.waiting.removeAll(keepingCapacity: state.waiting.count <= 64)
                state.head = 0
            } else if state.head >= 64, state.head * 2 >= state.waiting.count {
                state.waiting.removeFirst(state.head)
                state.head = 0
            }
            return next
        }
        next?(Release(self))
    }

    /// The right to one place in flight; `callAsFunction` gives it back.
    public final class Release: Sendable {
        private let admission: Admission
        /// Set by the first call; an atomic flag rather than a `Locked`, which would cost a mutex per piece of work.
        private let released = Atomic<Bool>(false)

        fileprivate init(_ admission: Admission) { self.admission = admission }

        public func callAsFunction() {
            if !released.exchange(true, ordering: .acquiringAndReleasing) { admission.leave() }
        }
    }
}
