import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// A job accepted under some limits is rebuilt after a restart under lower ones (issue 10): through a real engine,
/// a real SQLite file and real fetches to the local upstream.
class GraphRestartLimitsTests: EngineTestCase {
    private func url(_ path: String) -> String {
        "\"\(upstream.url(path))\""
    }

    private func makeEngine(limits: Limits) throws -> Engine {
        try makeEngine { $0.limits = limits }
    }

    /// Submits `text` as the server would under `limits`: parsed to their JSON depth, validated under them.
    private func submit(_ engine: Engine, _ text: String, limits: Limits) throws -> JobRecord {
        let body = try JSONValue.parse(text, maxDepth: limits.requestJSONDepth)
        let spec = try JobSpec.parse(body, limits: limits)
        guard case .created(let job) = try engine.submit(spec, request: body, idempotencyKey: nil) else {
            throw UpstreamError("the job was not created")
        }
        return job
    }

    /// Stops the engine before its job can settle, as a crash would, and starts another on the same file.
    private func restart(_ engine: Engine, jobID: String, limits: Limits) throws -> Engine {
        let before = try XCTUnwrap(try engine.job(id: jobID))
        XCTAssertFalse(before.state.isSettled, "the job settled before the restart; nothing was rebuilt")
        engine.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        return try makeEngine(limits: limits)
    }

    /// Waits, at most `seconds`, for the job to settle, and when it succeeded for every node of it too.
    private func settledOrFailed(_ engine: Engine, _ id: String, seconds: Double = 20) throws -> JobRecord {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let done = DispatchSemaphore(value: 0)
            let seen = Box<JobRecord?>(nil)
            _ = engine.waitForChange(id: id, afterVersion: nil, timeoutMs: 200) { job in
                seen.value = job
                done.signal()
            }
            done.wait()
            // A job that failed is returned at once, so that a refused rebuild fails with its error, not a timeout.
            if let job = seen.value, job.state.isSettled,
                job.state != .succeeded || job.progress.pending + job.progress.running == 0
            {
                return job
            }
        }
        throw UpstreamError("job \(id) did not settle within \(seconds) s")
    }

    func testJobAcceptedUnderMoreNodesIsRebuiltUnderFewer() throws {
        let accepted = Limits(maxNodes: 4)
        let first = try makeEngine(limits: accepted)
        let job = try submit(
            first,
            #"{"graph":{"type":"sequence","children":[{"type":"fetch","url":\#(url("/delay/300"))},"#
                + #"{"type":"fetch","url":\#(url("/count/a"))},{"type":"fetch","url":\#(url("/count/b"))}]}}"#,
            limits: accepted)
        XCTAssertEqual(job.progress.total, 4)

        let second = try restart(first, jobID: job.id, limits: Limits(maxNodes: 2))
        let done = try settledOrFailed(second, job.id)
        XCTAssertEqual(done.state, .succeeded, "\(done.error.map { "\($0)" } ?? "")")
        XCTAssertEqual(done.progress.succeeded, 4)
        XCTAssertEqual(done.result?.arrayValue?.count, 3)
    }

    /// A chain of `depth` sequences around a fetch of `path`, as JSON text.
    private func chain(depth: Int, path: String) throws -> String {
        #"{"graph":"# + String(repeating: #"{"type":"sequence","children":["#, count: depth - 1)
            + #"{"type":"fetch","url":\#(url(path))}"# + String(repeating: "]}", count: depth - 1) + "}"
    }

    func testJobAcceptedUnderMoreDepthIsRebuiltUnderLess() throws {
        let depth = 200
        let accepted = Limits(maxDepth: depth)
        let first = try makeEngine(limits: accepted)
        let job = try submit(first, try chain(depth: depth, path: "/delay/300"), limits: accepted)
        XCTAssertEqual(job.progress.total, depth)

        let second = try restart(first, jobID: job.id, limits: Limits())
        let done = try settledOrFailed(second, job.id)
        XCTAssertEqual(done.state, .succeeded, "\(done.error.map { "\($0)" } ?? "")")
        XCTAssertEqual(done.progress.succeeded, depth)
        let nodes = try XCTUnwrap(try second.nodes(jobID: job.id, includeResults: false))
        XCTAssertEqual(nodes.map(\.state), Array(repeating: .succeeded, count: depth))
    }

    func testJobNestedDeeperThanTheStoresOldBoundIsReadBackAndRebuilt() throws {
        // 2,500 levels of sequences, accepted under --max-depth 3000: about 5,000 levels of JSON, more than the
        // store once read back (4,096), which made a restarted server refuse to start.
        let depth = 2_500
        let accepted = Limits(maxDepth: 3_000)
        let text = try chain(depth: depth, path: "/count/deep")
        let request = try JSONValue.parse(text, maxDepth: accepted.requestJSONDepth)
        let spec = try JobSpec.parse(request, limits: accepted)
        var progress = Progress()
        progress.total = depth
        progress.pending = depth
        let job = JobRecord(id: "job-deep", createdAt: 1_700_000_000_000, request: request, progress: progress)
        let nodes = spec.graph.nodes.map { node in
            NodeRecord(
                jobID: job.id, id: node.id, parent: node.parent.map { spec.graph.nodes[$0].id }, position: node.index,
                type: node.typeName)
        }
        let store = try makeStore(dbName: "deep.sqlite")
        guard case .created = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil) else {
            return XCTFail("the job was not created")
        }
        store.close()

        // A restart: the store reads the job back, and it is rebuilt under this run's default limits.
        let reopened = try makeStore(dbName: "deep.sqlite")
        defer { reopened.close() }
        let unfinished = try reopened.unfinishedJobs()
        XCTAssertEqual(unfinished.map(\.job.id), [job.id])
        let stored = try XCTUnwrap(unfinished.first)
        XCTAssertEqual(stored.job.request.text, text)
        XCTAssertEqual(stored.nodes.count, depth)
        let now = Limits()
        XCTAssertThrowsError(try JobSpec.parse(stored.job.request, limits: now), "the current limits refuse it")
        let rebuilt = try JobSpec.parse(stored.job.request, limits: now.forStoredJobs)
        XCTAssertEqual(rebuilt.graph, spec.graph)
        XCTAssertEqual(rebuilt.graph.nodes.last?.id, "root" + String(repeating: ".0", count: depth - 1))
    }
}
