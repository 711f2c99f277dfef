import Dispatch
import Threads

#if canImport(Glibc)
import Glibc
#endif

/// Gives memory freed in bulk back to the system.
///
/// A job of many nodes, or a stored one read back, is made of millions of small allocations: its results, their
/// members and strings. glibc keeps what they free in its arenas, and returns only a free stretch at an arena's top,
/// which the allocations of other work soon pin: a job of 100,000 fetches of 1 KiB left the server at 541–589 MiB
/// resident after it had left memory, and one read of it from the store at 355 MiB, where 35 MiB was in use
/// (`bench/88-many-results.sh`). `malloc_trim` hands back every free page of every arena.
///
/// `bulkFreed` is called after such work let go of its values. It asks for one trim, `delayMs` later on a
/// background queue, so that what is being freed is freed by then, and so that a burst of such work (many large jobs
/// retired together, readers of large jobs one after the other) is one trim. The trim locks one arena at a time.
final class MemoryReturn: Sendable {
    /// How long after the request the trim runs.
    static let delayMs = 250
    /// A run this large (in nodes) leaving memory asks for a trim.
    static let defaultMinNodes = 10_000
    /// An answer this large, made from the store, asks for a trim once its values are let go.
    static let defaultMinAnswerBytes = 8 << 20

    private struct State {
        var pending = false
        /// Trims asked for, and run, so far (tests).
        var asked = 0
        var trims = 0
        var minNodes = MemoryReturn.defaultMinNodes
        var minAnswerBytes = MemoryReturn.defaultMinAnswerBytes
    }

    private let state = Watched(State())
    /// Where trims run (tests suspend it).
    let queue = DispatchQueue(label: "jobserver.memory-return", qos: .background)

    /// The smallest run, in nodes, whose leaving asks for a trim (tests set it lower).
    var minNodes: Int {
        get { state.withLock { $0.minNodes } }
        set { state.withLock { $0.minNodes = newValue } }
    }

    /// The smallest answer made from the store, in bytes, that asks for a trim (tests set it lower).
    var minAnswerBytes: Int {
        get { state.withLock { $0.minAnswerBytes } }
        set { state.withLock { $0.minAnswerBytes = newValue } }
    }

    /// Trims asked for so far.
    var asked: Int { state.withLock { $0.asked } }

    /// Trims run so far.
    var trims: Int { state.withLock { $0.trims } }

    /// Whether a trim is asked for and has not begun.
    var isPending: Bool { state.withLock { $0.pending } }

    /// Waits, for at most `milliseconds`, until `count` trims have run; whether they have (tests).
    func waitForTrims(_ count: Int, milliseconds: Int64) -> Bool {
        state.wait(milliseconds: milliseconds) { $0.trims >= count }
    }

    /// Runs of `nodes` nodes in all have left memory.
    func runsLeft(nodes: Int) {
        if nodes >= minNodes { bulkFreed() }
    }

    /// An answer of `bytes` was made from values read from the store, which its maker lets go of now.
    func answerMade(bytes: Int) {
        if bytes >= minAnswerBytes { bulkFreed() }
    }

    /// Asks for a trim, unless one is already asked for.
    func bulkFreed() {
        let ask = state.withLock { state -> Bool in
            if state.pending { return false }
            state.pending = true
            state.asked += 1
            return true
        }
        guard ask else { return }
        queue.asyncAfter(deadline: .now() + .milliseconds(Self.delayMs)) { [self] in
            // Cleared first: what is freed while the trim runs asks for the next one.
            state.withLock { $0.pending = false }
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
