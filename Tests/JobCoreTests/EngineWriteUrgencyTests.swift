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
        let recorder = Batches([])
        let engine = try makeEngine(store: { recording($0, recorder) })
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
            let settlesTheFetch = { (batch: Batch) in
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
        let recorder = Batches([])
        let engine = try makeEngine(
            configure: { $0.maxActiveNodes = 8 }, store: { recording($0, recorder) })
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

/// For each batch of state changes the engine queues, which nodes it settles and whether it was urgent.
private struct Batch {
    var urgent: Bool
    var settledNodes: Set<NodeKey>
}

private typealias Batches = Watched<[Batch]>

/// A store over `base` that records each batch of state changes in `batches`.
private func recording(_ base: JobStore, _ batches: Batches) -> JobStore {
    ForwardingStore(base: base, enqueued: { nodes, urgent in
        let settled = Set(nodes.filter(\.state.isSettled).map { NodeKey(jobID: $0.jobID, position: $0.position) })
        batches.withLock { $0.append(Batch(urgent: urgent, settledNodes: settled)) }
    })
}
