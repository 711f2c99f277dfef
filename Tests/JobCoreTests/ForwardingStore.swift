@testable import JobCore

/// A store that hands everything to `base`, and lets a test see the state changes the engine queues (`enqueued`,
/// called after they are handed on) or step in on a job's creation (`creating`).
final class ForwardingStore: JobStore {
    typealias CreateCompletion = @Sendable (Result<CreateOutcome, StoreError>) -> Void

    let base: JobStore
    let enqueued: (@Sendable (_ nodes: [NodeRecord], _ urgent: Bool) -> Void)?
    /// Given each creation's job, a function that hands the creation to `base`, and the creation's completion: it
    /// may call either, at once or later. Without it, creations go to `base` at once.
    let creating: (@Sendable (JobRecord, _ forward: @escaping @Sendable () -> Void, @escaping CreateCompletion) -> Void)?

    init(
        base: JobStore, enqueued: (@Sendable ([NodeRecord], Bool) -> Void)? = nil,
        creating: (@Sendable (JobRecord, @escaping @Sendable () -> Void, @escaping CreateCompletion) -> Void)? = nil
    ) {
        self.base = base
        self.enqueued = enqueued
        self.creating = creating
    }

    func enqueue(
        jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)], urgent: Bool
    ) {
        base.enqueue(jobs: jobs, nodes: nodes, bodies: bodies, urgent: urgent)
        enqueued?(nodes, urgent)
    }

    func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?, nodesMayFollow: Bool,
        completion: @escaping CreateCompletion
    ) {
        let base = self.base
        let forward: @Sendable () -> Void = {
            base.createJob(
                job, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash,
                nodesMayFollow: nodesMayFollow, completion: completion)
        }
        guard let creating else { return forward() }
        creating(job, forward, completion)
    }
    func enqueue(unstoredNodes: [NodeRecord]) { base.enqueue(unstoredNodes: unstoredNodes) }
    func flush(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) { base.flush(completion) }
    func whenCommitted(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        base.whenCommitted(completion)
    }
    var health: StoreHealth { base.health }
    func waitForHealth(milliseconds: Int64, until accept: (StoreHealth) -> Bool) -> Bool {
        base.waitForHealth(milliseconds: milliseconds, until: accept)
    }
    func job(id: String) throws -> JobRecord? { try base.job(id: id) }
    func jobWithoutRequest(id: String) throws -> JobRecord? { try base.jobWithoutRequest(id: id) }
    func jobState(id: String) throws -> NodeState? { try base.jobState(id: id) }
    func jobVersion(id: String) throws -> Int64? { try base.jobVersion(id: id) }
    func nodeCount(id: String) throws -> Int? { try base.nodeCount(id: id) }
    func listJobs(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage {
        try base.listJobs(state: state, limit: limit, cursor: cursor)
    }
    func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord] {
        try base.nodes(jobID: jobID, includeResults: includeResults)
    }
    func node(jobID: String, nodeID: String) throws -> NodeRecord? { try base.node(jobID: jobID, nodeID: nodeID) }
    func body(jobID: String, nodeID: String) throws -> StoredBody? { try base.body(jobID: jobID, nodeID: nodeID) }
    func deleteJob(id: String, _ completion: @escaping @Sendable (Result<Bool, StoreError>) -> Void) {
        base.deleteJob(id: id, completion)
    }
    func unfinishedJobs(unreadable: inout [UnreadableJob]) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        try base.unfinishedJobs(unreadable: &unreadable)
    }
    func unsettledNodesOfSettledJobs() throws -> [NodeRecord] { try base.unsettledNodesOfSettledJobs() }
    func sweep(finishedBeforeMs: Int64) throws -> Int { try base.sweep(finishedBeforeMs: finishedBeforeMs) }
    func jobCounts() throws -> [NodeState: Int] { try base.jobCounts() }
    func settledJobCounts(finishedBeforeMs: Int64) throws -> [NodeState: Int] {
        try base.settledJobCounts(finishedBeforeMs: finishedBeforeMs)
    }
    func close() { base.close() }
    func dueJobs(
        atOrBeforeMs: Int64, after: (dueAt: Int64, id: String)?, limit: Int, maxNodes: Int, skipping: (String) -> Bool,
        unreadable: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        try base.dueJobs(
            atOrBeforeMs: atOrBeforeMs, after: after, limit: limit, maxNodes: maxNodes, skipping: skipping,
            unreadable: &unreadable)
    }
    func nextDueAt(after afterMs: Int64) throws -> Int64? { try base.nextDueAt(after: afterMs) }
    func scheduledJobCount() throws -> Int { try base.scheduledJobCount() }
    func expandMap(_ expansion: MapExpansionRecord, _ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        base.expandMap(expansion, completion)
    }
    func mapExpansions(jobID: String) throws -> [MapExpansionRecord] { try base.mapExpansions(jobID: jobID) }
}
