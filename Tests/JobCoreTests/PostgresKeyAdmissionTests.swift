import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// `concurrency_key` over several servers on one PostgreSQL database (API.md §8, §10): two engines on one database
/// play two servers; the store's admission (`jobserver_key_admit`) is also checked on its own.
final class PostgresKeyAdmissionTests: EngineTestCase {
    override class var usesPostgres: Bool { true }

    func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    /// The job as `GET /v1/jobs/{id}` shows it.
    func read(_ engine: Engine, _ id: String) throws -> JobRecord? {
        let read = try engine.answer("read of \(id)") { done in engine.readJob(id: id) { done($0) } }.get()
        if case .record(let job) = read { return job }
        return nil
    }

    func keyed(_ key: String, limit: Int = 1, _ path: String) -> String {
        #"{"concurrency_key": "\#(key)", "concurrency_limit": \#(limit), "graph": {"type": "fetch", "url": \#(u(path))}}"#
    }

    func testALimitHoldsOverTwoServersAndJobsStartInSubmissionOrder() throws {
        let a = try makeEngine(dbName: "shared")
        let b = try makeEngine(dbName: "shared")
        var ids: [String] = []
        for k in 0..<10 {
            ids.append(try submit(k % 2 == 0 ? a : b, keyed("pair", limit: 2, "/delay/120")).id)
        }
        let done = try ids.enumerated().map { try settled($0.offset % 2 == 0 ? b : a, $0.element) }
        for job in done { XCTAssertEqual(job.state, .succeeded) }
        let spans = try done.map { (start: try XCTUnwrap($0.startedAt), end: try XCTUnwrap($0.finishedAt)) }
        // A slot is given back once the settled state is committed, after `finished_at`: a job that starts in the
        // millisecond another finished did not run beside it.
        var edges = spans.flatMap { [($0.start, 1), ($0.end, -1)] }
        edges.sort { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }
        var running = 0
        var most = 0
        for edge in edges {
            running += edge.1
            most = max(most, running)
        }
        XCTAssertLessThanOrEqual(most, 2, "more jobs of the key ran at once over two servers than its limit")
        for i in spans.indices {
            for j in spans.indices where j >= i + 2 {
                XCTAssertGreaterThanOrEqual(spans[j].start, spans[i].start, "job \(j) started before job \(i)")
            }
        }
    }

    func testAWaitingJobShowsItsPlaceOnEitherServerAndIsCancelledAndRetriedThroughTheOther() throws {
        let a = try makeEngine(dbName: "shared")
        let b = try makeEngine(dbName: "shared")
        let counted = "key-cancel-\(UUID().uuidString)"
        let holder = try submit(a, keyed("g", "/delay/1500"))
        XCTAssertNil(holder.queuePosition)
        let first = try submit(b, keyed("g", "/count/\(counted)"))
        let second = try submit(a, keyed("g", "/json"))
        XCTAssertEqual(first.queuePosition, 1, "the submission's answer shows the place over both servers")
        XCTAssertEqual(second.queuePosition, 2)
        XCTAssertEqual(try read(a, second.id)?.queuePosition, 2, "on the server that runs it")
        XCTAssertEqual(try read(b, second.id)?.queuePosition, 2, "on the other")
        XCTAssertEqual(try b.job(id: second.id)?.queuePosition, 2, "a long-poll's answer on the other")
        for engine in [a, b] {
            let page = try engine.answer("list") { done in engine.list(state: .pending, limit: 10, cursor: nil) { done($0) } }.get()
            XCTAssertEqual(page.jobs.map(\.queuePosition), [2, 1], "a listing of pending jobs, newest first, on either server")
        }

        guard case .cancelling(let cancelled) = try cancel(a, first.id) else { return XCTFail("not cancelled") }
        XCTAssertEqual(cancelled.state, .cancelled)
        XCTAssertEqual(try read(b, second.id)?.queuePosition, 1)
        XCTAssertEqual(try read(a, second.id)?.queuePosition, 1)
        guard case .retrying(let retried) = try retry(a, first.id) else { return XCTFail("not retried") }
        XCTAssertEqual(retried.queuePosition, 1, "the retry's answer shows its place")
        XCTAssertEqual(try read(b, first.id)?.queuePosition, 1, "a retried job waits in its place by submission")
        XCTAssertEqual(try read(b, second.id)?.queuePosition, 2)

        let ran = try [holder, first, second].map { try settled(a, $0.id) }
        for job in ran { XCTAssertEqual(job.state, .succeeded) }
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(ran[1].startedAt), try XCTUnwrap(ran[0].finishedAt))
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(ran[2].startedAt), try XCTUnwrap(ran[1].finishedAt))
        XCTAssertEqual(try upstream.stats()["counters"]?[counted]?.intValue ?? 0, 1, "the cancelled job fetched only when it ran again")
        XCTAssertEqual(try a.metricsNow.waitingForKey, 0)
        XCTAssertEqual(try b.metricsNow.waitingForKey, 0)
    }

    func testTheStoreLetsInTheOldestWaitingJobsWhileTheKeyHasAFreeSlot() throws {
        try makeStore(dbName: "admission").close()
        let url = try XCTUnwrap(databases["admission"])
        let one = try PostgresJobStore(url: url)
        defer { one.close() }
        let two = try PostgresJobStore(url: url)
        defer { two.close() }
        for (k, store) in [one, two, one, two, one].enumerated() {
            var progress = Progress()
            progress.total = 1
            progress.pending = 1
            var job = JobRecord(
                id: "J\(k)", name: nil, state: .pending, createdAt: 1_700_000_000_000,
                request: .object(["graph": .object(["type": "fetch"])]), progress: progress)
            job.concurrencyKey = "k"
            job.concurrencyLimit = 2
            _ = try store.createJob(
                job, nodes: [NodeRecord(jobID: job.id, id: "root", parent: nil, position: 0, type: "fetch")],
                idempotencyKey: nil, requestHash: nil)
        }
        var pass = try one.admitNow("k")
        XCTAssertEqual(pass.holders.sorted(), ["J0", "J1"])
        XCTAssertEqual(pass.waiting, ["J2", "J3", "J4"])
        pass = try two.admitNow("k")
        XCTAssertEqual(pass.holders.sorted(), ["J0", "J1"], "another server lets in no more")
        XCTAssertEqual(try two.queuePosition(jobID: "J3"), 2)
        XCTAssertNil(try two.queuePosition(jobID: "J1"))

        try executeRaw("UPDATE jobs SET state = 'running' WHERE id = 'J0'", dbName: "admission")
        try executeRaw("UPDATE jobs SET state = 'succeeded' WHERE id = 'J1'", dbName: "admission")
        pass = try two.admitNow("k")
        XCTAssertEqual(pass.holders, ["J2"], "a settled job's slot goes to the oldest waiting one; a running job keeps its")
        XCTAssertEqual(pass.waiting, ["J3", "J4"])

        // A retry makes a new attempt, which holds nothing and waits in its place by id.
        try executeRaw("UPDATE jobs SET state = 'pending', attempt = 2 WHERE id = 'J2'", dbName: "admission")
        pass = try one.admitNow("k")
        XCTAssertEqual(pass.holders, ["J2"], "the retried job is the oldest waiting one and takes the free slot")
        XCTAssertEqual(try one.queuePosition(jobID: "J4"), 2)
        XCTAssertGreaterThanOrEqual(one.keyAdmissionPasses, 2)
    }

    func retry(_ engine: Engine, _ id: String) throws -> RetryOutcome {
        try engine.answer("retry of \(id)") { done in engine.retry(id: id) { done($0) } }.get()
    }

    func cancel(_ engine: Engine, _ id: String) throws -> CancelOutcome {
        try engine.answer("cancel of \(id)") { done in engine.cancel(id: id) { done($0) } }.get()
    }
}
