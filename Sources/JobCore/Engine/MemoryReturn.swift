import Dispatch
import Threads

#if canImport(Glibc)
import Glibc
#endif

/// Gives memory freed in bulk back to the system, once the server has gone a while without such work.
///
/// A job of many nodes, or a stored one read back, is made of millions of small allocations: its results, their
/// members and strings. glibc keeps what they free in its arenas, and returns only a free stretch at an arena's top,
/// which the allocations of other work soon pin: a job of 100,000 fetches of 1 KiB left the server at 541–589 MiB
/// resident after it had left memory, and one read of it from the store at 355 MiB, where 35 MiB was in use
/// (`bench/88-many-results.sh`). `malloc_trim` hands back every free page of every arena.
///
/// Pages given back cost again when they are taken anew: each is faulted in and cleared, which on a virtual machine
/// whose host takes back what its guest frees is the host's work too. Trimmed 250 ms after each job, the next
/// 100,000-fetch job took 4,789 ms (median of 7) where, run alongside on the same machine without trims, it took
/// 4,398 ms: 1.26× and 1.16× curl's time for the same fetches. So, as jemalloc keeps freed pages for its
/// `dirty_decay_ms` (10 s) before it returns them, the trim waits until `quietMs` have passed since memory was last
/// freed in bulk, and until no large run is running: a server busy with large jobs keeps its pages, an idle one
/// gives them back. The decisions are `TrimPolicy`'s; this class runs them on a background queue.
///
/// Except where memory is what the jobs wait for: when jobs wait in the store for the room (`--max-active-nodes`)
/// that runs leaving give back, the next job is built on other threads, whose arenas would grow beside the ones
/// that keep the pages just freed. So once runs holding `roomTrimNodes` nodes in all have left while jobs waited,
/// the trim runs at once.
final class MemoryReturn: Sendable {
    /// How long the server goes without freeing in bulk before the trim.
    static let defaultQuietMs = 10_000
    /// A run this large (in nodes) leaving memory asks for a trim; one running holds it back.
    static let defaultMinNodes = 10_000
    /// An answer this large, made from the store, asks for a trim once its values are let go.
    static let defaultMinAnswerBytes = 8 << 20

    private struct State {
        var policy = TrimPolicy(quietNs: UInt64(MemoryReturn.defaultQuietMs) * 1_000_000)
        var minNodes = MemoryReturn.defaultMinNodes
        var minAnswerBytes = MemoryReturn.defaultMinAnswerBytes
        var roomTrimNodes = Int.max
        /// Nodes of the runs that left while jobs waited for room, since the last trim for it.
        var leftForRoom = 0
        /// Frees in bulk told of, checks made, and trims run, so far (tests).
        var asked = 0
        var checks = 0
        var trims = 0
    }

    private let state = Watched(State())
    /// Where trims run (tests suspend it).
    let queue = DispatchQueue(label: "jobserver.memory-return", qos: .background)

    /// The smallest run, in nodes, whose leaving asks for a trim and whose running holds one back (tests set it
    /// lower).
    var minNodes: Int {
        get { state.withLock { $0.minNodes } }
        set { state.withLock { $0.minNodes = newValue } }
    }

    /// The smallest answer made from the store, in bytes, that asks for a trim (tests set it lower).
    var minAnswerBytes: Int {
        get { state.withLock { $0.minAnswerBytes } }
        set { state.withLock { $0.minAnswerBytes = newValue } }
    }

    /// Runs holding this many nodes in all leaving while jobs wait for room trim at once (the engine sets it from
    /// `--max-active-nodes`; `Int.max`: never).
    var roomTrimNodes: Int {
        get { state.withLock { $0.roomTrimNodes } }
        set { state.withLock { $0.roomTrimNodes = max(1, newValue) } }
    }

    /// How long, in milliseconds, the server goes without freeing in bulk before the trim (tests set it lower).
    var quietMs: Int {
        get { state.withLock { Int($0.policy.quietNs / 1_000_000) } }
        set { state.withLock { $0.policy.quietNs = UInt64(max(0, newValue)) * 1_000_000 } }
    }

    /// How many times memory was freed in bulk, each an ask for a trim (tests).
    var asked: Int { state.withLock { $0.asked } }

    /// Trims run so far.
    var trims: Int { state.withLock { $0.trims } }

    /// Whether a check for a trim is scheduled.
    var isPending: Bool { state.withLock { $0.policy.scheduled } }

    /// Waits, for at most `milliseconds`, until `trims` trims have run and `checks` checks were made; whether they
    /// were (tests).
    func waitFor(trims: Int = 0, checks: Int = 0, milliseconds: Int64) -> Bool {
        state.wait(milliseconds: milliseconds) { $0.trims >= trims && $0.checks >= checks }
    }

    /// The job's run begins with `nodes` nodes: a large one holds trims back until it leaves.
    func runBegan(_ id: String, nodes: Int) {
        state.withLock { state in
            if nodes >= state.minNodes { state.policy.largeRuns.insert(id) }
        }
    }

    /// The job's run left memory, however it ended.
    func runEnded(_ id: String) {
        state.withLock { _ = $0.policy.largeRuns.remove(id) }
    }

    /// Runs of `nodes` nodes in all have left memory; `jobsWaitForRoom`: jobs wait in the store for the room they
    /// gave back.
    func runsLeft(nodes: Int, jobsWaitForRoom: Bool = false) {
        let trimAtOnce = jobsWaitForRoom && state.withLock { state in
            state.leftForRoom += nodes
            guard state.leftForRoom >= state.roomTrimNodes else { return false }
            state.leftForRoom = 0
            return true
        }
        if trimAtOnce { queue.async { self.trimNow() } }
        if nodes >= minNodes { bulkFreed() }
    }

    /// An answer of `bytes` was made from values read from the store, which its maker lets go of now.
    func answerMade(bytes: Int) {
        if bytes >= minAnswerBytes { bulkFreed() }
    }

    /// Gives every free page back now, on the caller's thread: when the memory just freed would otherwise stay with
    /// its thread's arena while the next work, on another thread, grows its own.
    func trimNow() {
        _ = Self.mallocTrim?(0)
        state.withLock { $0.trims += 1 }
    }

    /// Memory was freed in bulk: a trim once the server has been quiet long enough.
    func bulkFreed() {
        let next = state.withLock { state -> TrimPolicy.Next in
            state.asked += 1
            return state.policy.freed(at: DispatchTime.now().uptimeNanoseconds)
        }
        follow(next)
    }

    private func follow(_ next: TrimPolicy.Next) {
        switch next {
        case .nothing:
            return
        case .check(let afterNs):
            queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: afterNs))) { [self] in
                follow(state.withLock { state in
                    state.checks += 1
                    return state.policy.check(at: DispatchTime.now().uptimeNanoseconds)
                })
            }
        case .trim:
            _ = Self.mallocTrim?(0)
            state.withLock { $0.trims += 1 }
        }
    }

    /// `malloc_trim(0)`, looked up rather than declared (the Glibc module does not bring in `<malloc.h>`); nothing
    /// where it is not found.
    private static let mallocTrim: (@convention(c) (Int) -> Int32)? = {
        #if canImport(Glibc)
        // A null handle is RTLD_DEFAULT, the process's own symbols.
        guard let symbol = dlsym(nil, "malloc_trim") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)
        #else
        return nil
        #endif
    }()
}

/// When `MemoryReturn` trims: after `quietNs` without memory freed in bulk, and with no large run running. A value,
/// stepped with the times given, so that tests need no clock.
struct TrimPolicy: Equatable {
    var quietNs: UInt64
    /// The jobs whose large runs are running.
    var largeRuns: Set<String> = []
    /// When memory was last freed in bulk, if it has not been trimmed since.
    var freedAt: UInt64?
    /// A check is scheduled.
    var scheduled = false

    enum Next: Equatable {
        case nothing
        /// Check again (`check(at:)`) this much later.
        case check(afterNs: UInt64)
        case trim
    }

    /// Memory was freed in bulk at `now`.
    mutating func freed(at now: UInt64) -> Next {
        freedAt = now
        if scheduled { return .nothing }
        scheduled = true
        return .check(afterNs: quietNs)
    }

    /// The scheduled check, at `now`.
    mutating func check(at now: UInt64) -> Next {
        guard let freedAt, largeRuns.isEmpty else {
            // Nothing to give back, or a large run that may take it up: the run's leaving asks again.
            scheduled = false
            return .nothing
        }
        let quietFor = now >= freedAt ? now - freedAt : 0
        if quietFor < quietNs { return .check(afterNs: quietNs - quietFor) }
        scheduled = false
        self.freedAt = nil
        return .trim
    }
}
