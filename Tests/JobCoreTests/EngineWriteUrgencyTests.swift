import Foundation
import TestSupport
import Threads
import XCTest
@testable import JobCore

/// The engine's half of the writer's priority rule (`WriteQueue`, docs/store.md *Threads*): the end of a fetch that
/// may not be repeated is handed to the store as urgent, so that a crash cannot make the server send it again; the
/// end of one that may be repeated is not, and waits for idle CPU time. The store's half, what urgency does to the
/// writer, is `WriteQueueTests`.
final class EngineWriteUrgencyTests: EngineTestCase {
    func testTheEndOfAFetchThatMayNotBeRepeatedIsHandedToTheStoreAsUrgent() throws {
        let recorder = RecordingStore.Batches([])
        let engine = try makeEngine(store: { RecordingStore(base: $0, batches: recorder) })
        // (method, the fetch's `idempotent` field, whether its end is urgent)
        let table: [(method: String, idempotent: Bool?, urgent: Bool)] = [
            ("POST", nil, true),
            ("PATCH", nil, true),
            ("GET", nil, false),
            ("PUT", nil, false),
            ("DELETE", nil, false),
            ("POST", true, false),
            ("GET", false, true),
        ]
        for row in table {
            let what = "\(row.method), idempotent \(row.idempotent.map(String.init) ?? "unset")"
            let idempotent = row.idempotent.map { #","idempotent":\#($0)"# } ?? ""
            // A second child that never ends keeps the job running: the first one's end is the only urgent change
            // there could be (a job that settles is urgent by itself). Positions in tree order: the list is 0, its
            // children 1 and 2.
            let job = try submit(engine, """
                {"graph":{"type":"list","children":[
                  {"type":"fetch","method":"\(row.method)","url":"\(upstream.url("/echo"))"\(idempotent)},
                  {"type":"fetch","url":"\(upstream.url("/hang"))"}]}}
                """)
            let settlesTheFetch = { (batch: RecordingStore.Batch) in
                batch.settledNodes.contains(NodeKey(jobID: job.id, position: 1))
            }
            let handedOver = recorder.wait(milliseconds: 10_000) { $0.contains(where: settlesTheFetch) }
            XCTAssertTrue(handedOver, "\(what): the fetch's end never reached the store")
            let batch = recorder.withLock { $0.first(where: settlesTheFetch) }
            XCTAssertEqual(batch?.urgent, row.urgent, what)
            XCTAssertEqual(batch?.settledNodes.contains(NodeKey(jobID: job.id, position: 2)), false, what)
            // Cancelling ends the /hang transfer; the job's settled state is urgent whatever its fetches were.
            let cancelled = try engine.answer("cancel of \(job.id)") { done in engine.cancel(id: job.id) { done($0) } }
            guard case .success(.cancelling) = cancelled else { return XCTFail("\(what): cancel answered \(cancelled)") }
            _ = try settled(engine, job.id)
        }
    }
}

extension EngineWriteUrgencyTests {
    /// A job larger than the node bound, which runs alone, has its changes handed to the store as urgent as it runs,
    /// so that the writer does not hold them all until it settles; a job within the bound has none of its fetches'
    /// ends urgent (they may all be repeated).
    func testAJobLargerThanTheNodeBoundHasItsChangesWrittenAsItRuns() throws {
        let recorder = RecordingStore.Batches([])
        let engine = try makeEngine(
            configure: { $0.maxActiveNodes = 8 }, store: { RecordingStore(base: $0, batches: recorder) })
        // (fetches under the list, whether a change is urgent before the job settles)
        let rows: [(what: String, fetches: Int, urgent: Bool)] = [
            ("8 nodes, the bound", 7, false),
            ("31 nodes, over the bound", 30, true),
        ]
        for row in rows {
            recorder.withLock { $0.removeAll() }
            let children = (0..<row.fetches).map { i in
                let url = upstream.url("/echo?i=\(i)")
                return #"{"type":"fetch","url":"\#(url)"}"#
            }
            let job = try submit(engine, #"{"graph":{"type":"list","children":[\#(children.joined(separator: ","))]}}"#)
            XCTAssertEqual(try settled(engine, job.id).state, .succeeded, row.what)
            let batches = recorder.withLock { $0 }
            let beforeSettling = batches.prefix { !$0.settledNodes.contains(NodeKey(jobID: job.id, position: 0)) }
            XCTAssertEqual(beforeSettling.contains(where: \.urgent), row.urgent, row.what)
        }
    }
}

/// A store that hands everything to `base` and keeps, for each batch of state changes the engine queues, which nodes
/// it settles and whether it was urgent.
private final class RecordingStore: JobStore {
    struct Batch {
        var urgent: Bool
        var settledNodes: Set<NodeKey>
    }
    typealias Batches = Watched<[Batch]>

    let base: JobStore
    let batches: Batches

    init(base: JobStore, batches: Batches) {
        self.base = base
        self.batches = batches
    }

    func enqueue(
        jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)], urgent: Bool
    ) {
        base.enqueue(jobs: jobs, nodes: nodes, bodies: bodies, urgent: urgent)
        let settled = Set(nodes.filter(\.state.isSettled).map { NodeKey(jobID: $0.jobID, position: $0.position) })
        batches.withLock { $0.append(Batch(urgent: urgent, settledNodes: settled)) }
    }

    func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?, nodesMayFollow: Bool,
        completion: @escaping @Sendable (Result<CreateOutcome, StoreError>) -> Void
    ) {
        base.createJob(
            job, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash, nodesMayFollow: nodesMayFollow,
            completion: completion)
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
