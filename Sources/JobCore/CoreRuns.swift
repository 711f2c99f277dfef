import Foundation
import Threads

/// Work split into runs done at once, one per core: the first run on the calling thread, each other on a queue of
/// its own, which waits for nothing, so that two callers at once take turns there and never wait on each other. The
/// queues are of the reads' class (`ReadPool.qos`), whose threads are left at a nice value of their own.
///
/// For work of one request that would otherwise keep one core busy while the other has nothing to do, such as the
/// answer of a list of many entries (`EntryRuns`).
enum CoreRuns {
    /// How many runs work is split into: one per core the process may use, up to 8.
    static let count = min(8, ProcessInfo.processInfo.activeProcessorCount)

    /// The queues that do every run but the first.
    private static let queues = (1..<max(2, count)).map {
        DispatchQueue(label: "jobserver.core-run.\($0)", qos: ReadPool.qos)
    }

    /// Calls `run` with each of `0..<runs` at once, and returns once every call has.
    /// - Parameter nice: the nice value the runs other than the first are done at (`nil`: their thread's).
    static func perform(_ runs: Int, nice: Int32? = nil, _ run: @escaping @Sendable (Int) -> Void) {
        let done = DispatchGroup()
        for k in 1..<max(1, runs) {
            queues[(k - 1) % queues.count].async(group: done) {
                if let nice { lowerCurrentThreadPriority(to: nice) }
                run(k)
            }
        }
        if runs > 0 { run(0) }
        done.wait()
    }

    /// The `k`-th of `runs` about equal parts of `0..<count`, in order.
    static func part(_ k: Int, of runs: Int, count: Int) -> Range<Int> {
        (count * k / runs)..<(count * (k + 1) / runs)
    }
}
