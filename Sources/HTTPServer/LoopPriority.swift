import Glibc

/// The nice value of the calling thread, raised for the event loops (see
/// `HTTPServerConfiguration.eventLoopPriorityBoost`).
enum LoopPriority {
    /// The calling thread's nice value (on Linux, `PRIO_PROCESS` with 0 names the calling thread, not the process).
    static func currentNice() -> Int32 {
        getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
    }

    /// Lowers the calling thread's nice value by `steps` (at most to -20), if the system allows it.
    /// - Returns: whether it was changed.
    @discardableResult
    static func raiseCurrentThread(by steps: Int32) -> Bool {
        guard steps > 0 else { return false }
        let wanted = max(-20, currentNice() - steps)
        return setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, wanted) == 0
    }
}
