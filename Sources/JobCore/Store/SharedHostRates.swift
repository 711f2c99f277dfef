/// A store several servers share that holds `--host-rate` over all of them (API.md §10): the starts to a host
/// are booked in the store, so that the servers together start at most `N` requests a second to it.
///
/// SQLite is never shared: there the engine's `HostRateLimiter` spaces the starts in memory.
public protocol SharedHostRates: AnyObject, Sendable {
    /// Books the next start to `host` (a host name, no port) for a fetch of `jobID` at `perSecond` over all
    /// servers and calls `completion` when it has come, with how long (ns) it was held back for the rate (0: at
    /// once); `nil` if the store closed or the job was withdrawn first. Never on the caller's thread nor blocking it.
    func awaitHostStart(
        _ host: String, perSecond: Double, jobID: String, _ completion: @escaping @Sendable (UInt64?) -> Void)

    /// The job's fetches still waiting in `awaitHostStart` are answered `nil` at once: the job is gone.
    func withdrawHostStarts(jobID: String)
}
