/// A store several servers share (PostgreSQL, API.md §10): each unfinished job is run by the one server that holds
/// its lease, and the store tells the engine what the other servers did to its jobs.
///
/// SQLite is never shared (one process owns the file), so the engine asks for none of this there.
public protocol SharedJobStore: JobStore {
    /// Where the store reports lost leases, jobs it claimed, cancels asked for elsewhere and jobs changed
    /// elsewhere; held weakly. Set once, before `unfinishedJobs`.
    func attach(_ delegate: SharedStoreDelegate)

    /// Starts the heartbeat (renewing this server's leases every third of the lease time), the claiming of jobs
    /// whose lease expired, and the listening for other servers' changes and cancels. After the engine started.
    func beginLeasing()

    /// False once this server cannot be sure it still holds its leases (the last renewal began a lease time
    /// ago): no new transfer may begin then, since another server may be taking its jobs over.
    var leasesHold: Bool { get }

    /// The engine let the job go (settled and written, or deleted): its lease is no longer renewed.
    func released(jobID: String)

    /// Asks the job's owner to cancel it: written first (so it survives a lost notification or a dead owner),
    /// then signalled. False when the job is not pending or running in the store.
    func requestCancel(id: String) throws -> Bool

    /// How long a lease lasts without renewal.
    var leaseTtlMs: Int64 { get }

    /// Takes one of the `limit` transfer slots of `host` over all servers (`--max-per-host`); `completion(true)`
    /// once one is taken (it waits for one meanwhile), `completion(false)` if the store closes first.
    func acquireHostSlot(_ host: String, limit: Int, _ completion: @escaping @Sendable (Bool) -> Void)

    /// Gives back one slot of `host` taken by `acquireHostSlot`.
    func releaseHostSlot(_ host: String)
}

/// Told by a `SharedJobStore` what happened to this server's jobs; calls come on the store's threads and must
/// only hand the work on.
public protocol SharedStoreDelegate: AnyObject, Sendable {
    /// Another server holds these jobs' leases now: their runs here must stop at once, writing nothing.
    func leasesLost(_ ids: [String])
    /// This server took these jobs over (their lease had expired): they resume under the restart rules.
    /// `cancelRequested`: the ids among them whose cancel was asked for before.
    func jobsClaimed(_ jobs: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob], cancelRequested: Set<String>)
    /// A cancel of these jobs was asked for on another server.
    func cancelRequested(_ ids: [String])
    /// These jobs changed (on any server): waiters on them look again.
    func jobsChanged(_ ids: [String])
    /// A renewal succeeded: transfers held back while the leases were in doubt may begin.
    func leasesRenewed()
}
