import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// API.md §8 in the engine: `not_before` jobs wait in the store, concurrency keys, retry.
class ScheduleTests: EngineTestCase {
    func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    func retry(_ engine: Engine, _ id: String) throws -> RetryOutcome {
        try engine.answer("retry of \(id)") { done in engine.retry(id: id) { done($0) } }.get()
    }

    func cancel(_ engine: Engine, _ id: String) throws -> CancelOutcome {
        try engine.answer("cancel of \(id)") { done in engine.cancel(id: id) { done($0) } }.get()
    }

    func counter(_ key: String) throws -> Int {
        try upstream.stats()["counters"]?[key]?.intValue ?? 0
    }

    // MARK: - Parsing

    func testRFC3339ParsesZonesAndFractions() {
        XCTAssertEqual(RFC3339.parse("1970-01-01T00:00:00Z"), 0)
        XCTAssertEqual(RFC3339.parse("2026-12-02T08:11:28.123Z"), 1_796_199_088_123)
        XCTAssertEqual(RFC3339.parse("2026-12-02T09:11:28.123+01:00"), 1_796_199_088_123)
        XCTAssertEqual(RFC3339.parse("2026-12-02t08:11:28.1234567z"), 1_796_199_088_123)
        XCTAssertNil(RFC3339.parse("2026-12-02T08:11:28"))
        XCTAssertNil(RFC3339.parse("2026-02-30T00:00:00Z"))
        XCTAssertNil(RFC3339.parse("2026-12-02"))
        XCTAssertNil(RFC3339.parse("2026-12-02T24:00:00Z"))
    }

    func testSchedulingFieldsAreCheckedWithTheirPaths() throws {
        func pointers(_ body: String) throws -> [String] {
            do {
                _ = try JobSpec.parse(try JSONValue.parse(body))
                return []
            } catch let error as ValidationError {
                return error.issues.map(\.pointer)
            }
        }
        let graph = #""graph": {"type": "fetch", "url": "http://127.0.0.1/x"}"#
        XCTAssertEqual(try pointers(#"{"not_before": 5, \#(graph)}"#), ["/not_before"])
        XCTAssertEqual(try pointers(#"{"not_before": "2999-01-01T00:00:00Z", \#(graph)}"#), ["/not_before"])
        XCTAssertEqual(try pointers(#"{"concurrency_key": "", \#(graph)}"#), ["/concurrency_key"])
        XCTAssertEqual(try pointers(#"{"concurrency_key": "k", "concurrency_limit": 1001, \#(graph)}"#), ["/concurrency_limit"])
        XCTAssertEqual(try pointers(#"{"concurrency_limit": 2, \#(graph)}"#), ["/concurrency_limit"])
        let spec = try JobSpec.parse(try JSONValue.parse(#"{"concurrency_key": "k", "not_before": "2020-01-01T00:00:00Z", \#(graph)}"#))
        XCTAssertEqual(spec.schedule, ScheduleOptions(notBefore: 1_577_836_800_000, concurrencyKey: "k", concurrencyLimit: 1))
    }

    func testConcurrencyGateLetsInBySubmissionOrderWithinTheLimit() {
        var gate = ConcurrencyGate()
        gate.enqueue(id: "b", key: "k", limit: 2)
        gate.enqueue(id: "a", key: "k", limit: 2)
        gate.enqueue(id: "c", key: "k", limit: 2)
        XCTAssertEqual(gate.admit(key: "k"), ["a", "b"])
        XCTAssertEqual(gate.position(id: "c", key: "k"), 1)
        XCTAssertEqual(gate.admit(key: "k"), [])
        gate.leave(id: "a", key: "k")
        XCTAssertEqual(gate.admit(key: "k"), ["c"])
        XCTAssertEqual(gate.waitingCount, 0)
        gate.leave(id: "b", key: "k")
        gate.leave(id: "c", key: "k")
        XCTAssertEqual(gate.running(key: "k"), 0)
    }

    // MARK: - not_before

    func testAJobWithNotBeforeWaitsInTheStoreAndStartsAfterItsTime() throws {
        let engine = try makeEngine()
        let due = Timestamp.nowMs() + 400
        let job = try submit(
            engine, #"{"not_before": "\#(Timestamp.format(due))", "graph": {"type": "fetch", "url": \#(u("/json"))}}"#)
        XCTAssertEqual(job.state, .pending)
        let waiting = try engine.metricsNow
        XCTAssertEqual(waiting.scheduledJobs, 1)
        XCTAssertEqual(waiting.activeJobs, 0, "a job waiting for its time is not in memory")
        XCTAssertEqual(waiting.jobsByState[.pending], 1)
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(done.startedAt), due)
        let after = try engine.metricsNow
        XCTAssertEqual(after.scheduledJobs, 0)
        XCTAssertEqual(after.jobsByState[.pending], 0)
        XCTAssertEqual(after.jobsByState[.succeeded], 1)
    }

    func testScheduledJobsAreRowsNotRuns() throws {
        let engine = try makeEngine()
        let later = Timestamp.format(Timestamp.nowMs() + 3_600_000)
        for _ in 0..<300 {
            _ = try submit(engine, #"{"not_before": "\#(later)", "graph": {"type": "fetch", "url": \#(u("/json"))}}"#)
        }
        let m = try engine.metricsNow
        XCTAssertEqual(m.scheduledJobs, 300)
        XCTAssertEqual(m.activeJobs, 0)
        XCTAssertEqual(m.nodesByState.values.reduce(0, +), 0, "no node of a waiting job is in memory")
        XCTAssertEqual(m.jobsByState[.pending], 300)
    }

    func testAScheduledJobSurvivesARestart() throws {
        let first = try makeEngine()
        let due = Timestamp.nowMs() + 300
        let job = try submit(
            first, #"{"not_before": "\#(Timestamp.format(due))", "graph": {"type": "fetch", "url": \#(u("/json"))}}"#)
        first.shutdown(gracePeriodMs: 2000)
        let second = try makeEngine()
        let done = try settled(second, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(done.startedAt), due)
    }

    func testCancellingAScheduledJobEndsItWithoutRunningIt() throws {
        let engine = try makeEngine()
        let key = "sched-cancel-\(UUID().uuidString)"
        let job = try submit(
            engine,
            #"{"not_before": "\#(Timestamp.format(Timestamp.nowMs() + 60_000))", "graph": {"type": "fetch", "url": \#(u("/count/\(key)"))}}"#)
        guard case .cancelling(let cancelled) = try cancel(engine, job.id) else { return XCTFail("not cancelling") }
        XCTAssertEqual(cancelled.state, .cancelled)
        XCTAssertEqual(try settled(engine, job.id).state, .cancelled)
        XCTAssertEqual(try engine.metricsNow.scheduledJobs, 0)
        XCTAssertEqual(try counter(key), 0)
        guard case .deleted = try engine.delete(id: job.id) else { return XCTFail("not deleted") }
    }

    func testDeletingAScheduledJobIsRefused() throws {
        let engine = try makeEngine()
        let job = try submit(
            engine, #"{"not_before": "\#(Timestamp.format(Timestamp.nowMs() + 60_000))", "graph": {"type": "fetch", "url": \#(u("/json"))}}"#)
        guard case .active = try engine.delete(id: job.id) else { return XCTFail("a pending job was deleted") }
    }

    // MARK: - Concurrency keys

    func testAKeyWithLimitOneRunsItsJobsOneAtATimeInSubmissionOrder() throws {
        let engine = try makeEngine()
        var ids: [String] = []
        for _ in 0..<4 {
            let job = try submit(
                engine, #"{"concurrency_key": "serial", "graph": {"type": "fetch", "url": \#(u("/delay/100"))}}"#)
            ids.append(job.id)
        }
        let last = try XCTUnwrap(try engine.job(id: ids[3]))
        if last.state == .pending { XCTAssertNotNil(last.queuePosition) }
        let done = try ids.map { try settled(engine, $0) }
        for job in done { XCTAssertEqual(job.state, .succeeded) }
        for k in 1..<done.count {
            let previous = try XCTUnwrap(done[k - 1].finishedAt)
            XCTAssertGreaterThanOrEqual(try XCTUnwrap(done[k].startedAt), previous, "job \(k) overlapped the one before")
        }
    }

    func testAJobWaitingForItsKeyShowsItsPlaceAndCanBeCancelled() throws {
        let engine = try makeEngine()
        let key = "gate-cancel-\(UUID().uuidString)"
        let first = try submit(engine, #"{"concurrency_key": "g", "graph": {"type": "fetch", "url": \#(u("/delay/300"))}}"#)
        let second = try submit(engine, #"{"concurrency_key": "g", "graph": {"type": "fetch", "url": \#(u("/count/\(key)"))}}"#)
        let third = try submit(engine, #"{"concurrency_key": "g", "graph": {"type": "fetch", "url": \#(u("/json"))}}"#)
        XCTAssertEqual(second.queuePosition, 1)
        XCTAssertEqual(third.queuePosition, 2)
        XCTAssertEqual(try engine.metricsNow.waitingForKey, 2)
        guard case .cancelling(let cancelled) = try cancel(engine, second.id) else { return XCTFail("not cancelling") }
        XCTAssertEqual(cancelled.state, .cancelled)
        XCTAssertEqual(try XCTUnwrap(try engine.job(id: third.id)).queuePosition, 1)
        XCTAssertEqual(try settled(engine, first.id).state, .succeeded)
        XCTAssertEqual(try settled(engine, third.id).state, .succeeded)
        XCTAssertEqual(try settled(engine, second.id).state, .cancelled)
        XCTAssertEqual(try counter(key), 0, "a cancelled waiting job made its request")
        XCTAssertEqual(try engine.metricsNow.waitingForKey, 0)
    }

    func testJobsRunningBeforeARestartKeepTheirSlots() throws {
        let first = try makeEngine()
        let a = try submit(first, #"{"concurrency_key": "r", "graph": {"type": "fetch", "url": \#(u("/delay/300"))}}"#)
        let b = try submit(first, #"{"concurrency_key": "r", "graph": {"type": "fetch", "url": \#(u("/delay/300"))}}"#)
        _ = try untilJob(first, a.id) { try first.job(id: a.id)?.state == .running }
        first.shutdown(gracePeriodMs: 2000)
        let second = try makeEngine()
        let doneA = try settled(second, a.id)
        let doneB = try settled(second, b.id)
        XCTAssertEqual(doneA.state, .succeeded)
        XCTAssertEqual(doneB.state, .succeeded)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(doneB.startedAt), try XCTUnwrap(doneA.finishedAt))
    }

    // MARK: - Room (`maxActiveNodes`)

    /// A list of `n` fetches of `path`: `n + 1` nodes.
    func list(_ n: Int, _ path: String) -> String {
        let children = Array(repeating: #"{"type": "fetch", "url": \#(u(path))}"#, count: n).joined(separator: ",")
        return #"{"graph": {"type": "list", "children": [\#(children)]}}"#
    }

    func testJobsOverTheNodeBoundWaitInTheStoreAndStartInTheOrderTheyCame() throws {
        let engine = try makeEngine { $0.maxActiveNodes = 4 }
        let holder = try submit(engine, list(2, "/hang"))
        // 3 + 3 > 4: waits in the store.
        let next = try submit(engine, list(2, "/json"))
        // 3 + 1 fits, but comes after a job that waits: waits too.
        let small = try submit(engine, #"{"graph": {"type": "fetch", "url": \#(u("/json"))}}"#)
        // 6 nodes, more than the whole bound: runs once no other job holds any.
        let large = try submit(engine, list(5, "/json"))
        XCTAssertEqual(holder.state, .running)
        for job in [next, small, large] {
            XCTAssertEqual(job.state, .pending)
            XCTAssertNotNil(try engine.store.job(id: job.id)?.dueAt, "job \(job.id) does not wait in the store")
        }
        var m = try engine.metricsNow
        XCTAssertEqual(m.activeNodes, 3)
        XCTAssertEqual(m.activeJobs, 1)
        XCTAssertEqual(m.scheduledJobs, 3)
        XCTAssertEqual(m.jobsByState[.pending], 3)

        _ = try cancel(engine, holder.id)
        let done = try [next, small, large].map { try settled(engine, $0.id) }
        for job in done { XCTAssertEqual(job.state, .succeeded) }
        XCTAssertNil(try engine.store.job(id: next.id)?.dueAt)
        let holderEnd = try XCTUnwrap(try settled(engine, holder.id).finishedAt)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(done[0].startedAt), holderEnd)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(done[1].startedAt), try XCTUnwrap(done[0].startedAt))
        // The large job began alone: after the two before it had ended.
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(done[2].startedAt), try XCTUnwrap(done[0].finishedAt))
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(done[2].startedAt), try XCTUnwrap(done[1].finishedAt))
        m = try engine.metricsNow
        XCTAssertEqual(m.scheduledJobs, 0)
    }

    func testManyJobsWaitingForRoomAreTakenInAsRoomComesBackAcrossReads() throws {
        // Reads of two jobs, each stopped by the room's nodes: every waiting job is taken in, none twice.
        let engine = try makeEngine {
            $0.maxActiveNodes = 3
            $0.dueBatchSize = 2
        }
        let holder = try submit(engine, list(2, "/hang"))
        var waiting: [JobRecord] = []
        for _ in 0..<12 { waiting.append(try submit(engine, list(1, "/json"))) }
        XCTAssertTrue(waiting.allSatisfy { $0.state == .pending })
        _ = try cancel(engine, holder.id)
        for job in waiting { XCTAssertEqual(try settled(engine, job.id).state, .succeeded) }
        XCTAssertEqual(try engine.metricsNow.scheduledJobs, 0)
    }

    func testAJobWaitingForRoomSurvivesARestart() throws {
        let first = try makeEngine { $0.maxActiveNodes = 2 }
        let holder = try submit(first, list(1, "/hang"))
        let waiting = try submit(first, list(1, "/json"))
        XCTAssertEqual(waiting.state, .pending)
        _ = try untilJob(first, holder.id) { try first.job(id: holder.id)?.state == .running }
        first.shutdown(gracePeriodMs: 500)
        // The job that was running takes its room at once; the one that waited waits on.
        let second = try makeEngine { $0.maxActiveNodes = 2 }
        XCTAssertEqual(try second.job(id: holder.id)?.state, .running)
        XCTAssertEqual(try second.job(id: waiting.id)?.state, .pending)
        _ = try cancel(second, holder.id)
        XCTAssertEqual(try settled(second, waiting.id).state, .succeeded)
    }

    // MARK: - Retry

    func testRetryKeepsSucceededNodesAndRunsTheRestAgain() throws {
        let engine = try makeEngine()
        let key = "retry-\(UUID().uuidString)"
        let job = try submit(
            engine, """
                {"graph": {"type": "sequence", "children": [
                  {"id": "one", "type": "fetch", "url": \(u("/count/\(key)-1"))},
                  {"id": "two", "type": "fetch", "url": \(u("/count/\(key)-2?fail=1"))},
                  {"id": "three", "type": "fetch", "url": \(u("/count/\(key)-3"))}]}}
                """)
        let failed = try settled(engine, job.id)
        XCTAssertEqual(failed.state, .failed)
        guard case .retrying(let again) = try retry(engine, job.id) else { return XCTFail("not retrying") }
        XCTAssertEqual(again.attempt, 2)
        XCTAssertGreaterThan(again.version, failed.version)
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.attempt, 2)
        XCTAssertEqual(try counter("\(key)-1"), 1)
        XCTAssertEqual(try counter("\(key)-2"), 2)
        XCTAssertEqual(try counter("\(key)-3"), 1)
        guard case .notRetryable = try retry(engine, job.id) else { return XCTFail("a succeeded job was retried") }
        guard case .notFound = try retry(engine, "01NOSUCHJOB") else { return XCTFail("an unknown job was retried") }
    }

    func testARetryIsDurable() throws {
        let first = try makeEngine()
        let key = "retry-durable-\(UUID().uuidString)"
        let job = try submit(first, #"{"graph": {"type": "fetch", "url": \#(u("/count/\(key)?fail=1"))}}"#)
        XCTAssertEqual(try settled(first, job.id).state, .failed)
        guard case .retrying = try retry(first, job.id) else { return XCTFail("not retrying") }
        first.shutdown(gracePeriodMs: 2000)
        let second = try makeEngine()
        let done = try settled(second, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.attempt, 2)
    }
}
