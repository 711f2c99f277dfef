import Threads

/// The nodes the jobs in memory hold together, against `EngineConfiguration.maxActiveNodes` (`--max-active-nodes`).
///
/// A job in memory costs a few KB per node whatever its results weigh (its graph, its node records, their copies
/// queued for the store, each fetch's result object), so the jobs a server may hold at once are bounded by their
/// nodes, not their number. A job that would take the count over the bound does not start: it waits in the store,
/// as a job waits for its `not_before` (a row with `due_at`, the time it came), and the timekeeper takes the waiting
/// jobs in, in the order they came, as room is given back. Once one waits, new jobs queue behind it, so that a large
/// job is not passed for ever by small ones. A job larger than the whole bound runs when no other job holds any.
///
/// Jobs that must be in memory take their nodes whatever the count: those resumed at start or taken over from
/// another server, run again (`retry`), or grown at run time (`map`).
final class NodeRoom: Sendable {
    private struct Count {
        var held = 0
        /// Jobs wait in the store for room: new ones go behind them.
        var queued = false
        /// Jobs sent to the store for room whose rows may not be committed yet, and how many were ever sent.
        var inTransit = 0
        var sent = 0
    }

    /// 0: no bound (the nodes are still counted).
    let budget: Int
    private let count = Locked(Count())

    init(budget: Int) {
        self.budget = max(0, budget)
    }

    /// Whether jobs wait in the store for room.
    var jobsWait: Bool { count.withLock { $0.queued } }

    /// Nodes held now.
    var held: Int { count.withLock { $0.held } }

    /// The most nodes the jobs read for taking in should hold together: what is free, or `Int.max` without a bound.
    var free: Int {
        guard budget > 0 else { return Int.max }
        return count.withLock { max(0, budget - $0.held) }
    }

    /// Takes `nodes` for a job just submitted, if they are free and no job waits in the store before it; otherwise
    /// the job is to wait there, and new ones after it too.
    func take(forNew nodes: Int) -> Bool {
        count.withLock { c in
            if budget > 0, c.queued || !Self.fits(nodes, held: c.held, budget: budget) {
                c.queued = true
                c.inTransit += 1
                c.sent += 1
                return false
            }
            c.held += nodes
            return true
        }
    }

    /// Takes `nodes` for the first job waiting in the store, if they are free; otherwise it waits on.
    func take(forWaiting nodes: Int) -> Bool {
        count.withLock { c in
            guard budget == 0 || Self.fits(nodes, held: c.held, budget: budget) else {
                c.queued = true
                return false
            }
            c.held += nodes
            return true
        }
    }

    /// Takes `nodes` whatever the count (a job that must be in memory).
    func take(_ nodes: Int) {
        count.withLock { $0.held += nodes }
    }

    /// Gives `nodes` back; true when jobs wait in the store for room (the timekeeper is to look).
    func give(_ nodes: Int) -> Bool {
        count.withLock { c in
            c.held = max(0, c.held - nodes)
            return c.queued
        }
    }

    /// A job `take(forNew:)` sent to the store is committed there (or was refused): a read from now on sees it.
    func arrived() {
        count.withLock { $0.inTransit -= 1 }
    }

    /// Before the timekeeper reads the waiting jobs: a mark for `noneQueued`, or `nil` while a job sent to the
    /// store may not be committed yet (a read would miss it).
    func markBeforeRead() -> Int? {
        count.withLock { $0.inTransit == 0 ? $0.sent : nil }
    }

    /// The timekeeper's read, begun at `mark`, found no job left waiting for room: new jobs need not queue, unless
    /// one was sent to the store since.
    func noneQueued(since mark: Int?) {
        count.withLock { c in
            if let mark, mark == c.sent, c.inTransit == 0 { c.queued = false }
        }
    }

    /// A job fits when it is the only one, or when the count stays within the bound.
    private static func fits(_ nodes: Int, held: Int, budget: Int) -> Bool {
        held == 0 || held + nodes <= budget
    }
}
