import Foundation
import XCTest
@testable import JobCore
import TestSupport

/// `Engine.watchEvents`: the batches an event stream is made of, in order, until the job settles; resuming from a
/// version; an unknown job; a settled job read from the store.
class EngineEventsTests: EngineTestCase {
    /// The upstream's URL for `path`, as a JSON string literal.
    private func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    /// The job once it and all its nodes settled (at most 10 s), through the long-poll.
    private func waitSettled(_ engine: Engine, _ id: String) throws -> JobRecord {
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            let job = try engine.answer("job \(id)") { done in
                _ = engine.waitForChange(id: id, afterVersion: nil, timeoutMs: 200) { done($0) }
            }
            if let job, job.state.isSettled, job.progress.pending + job.progress.running == 0 { return job }
        }
        throw UpstreamError("job \(id) did not settle")
    }
    private func submit(_ engine: Engine, _ body: String) throws -> JobRecord {
        let json = try JSONValue.parse(body)
        switch try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) {
        case .created(let job): return job
        case let other: throw UpstreamError("submit answered \(other)")
        }
    }

    /// Every batch until the last one (at most `seconds`).
    private func collect(_ engine: Engine, id: String, after: Int64?, seconds: Double = 15) throws -> [JobEventBatch?] {
        let batches = Box<[JobEventBatch?]>([])
        let lock = NSLock()
        let done = expectation(description: "last batch")
        let token = engine.watchEvents(id: id, afterVersion: after) { batch in
            lock.withLock { batches.value.append(batch) }
            if batch == nil || batch?.isLast == true { done.fulfill() }
        }
        wait(for: [done], timeout: seconds)
        token.cancel()
        return lock.withLock { batches.value }
    }

    func testStreamSeesEveryNodeStateUntilTheJobSettles() throws {
        let engine = try makeEngine()
        // The first fetch waits, so that the stream is registered before the list's children start.
        let fetches = (0..<5).map { _ in #"{"type":"fetch","url":\#(u("/delay/30"))}"# }.joined(separator: ",")
        let job = try submit(engine, #"{"graph":{"type":"sequence","children":[{"type":"fetch","url":\#(u("/delay/300"))},{"type":"list","children":[\#(fetches)]}]}}"#)
        let batches = try collect(engine, id: job.id, after: 0).compactMap { $0 }
        XCTAssertTrue(batches.first?.jobStateChanged == true, "the first batch carries the job")
        XCTAssertEqual(batches.last?.isLast, true)
        XCTAssertEqual(batches.last?.job.state, .succeeded)
        XCTAssertEqual(batches.filter { $0.isLast }.count, 1)
        let versions = batches.map { $0.job.version }
        XCTAssertEqual(versions, versions.sorted(), "batches come in version order")
        var seen: [String: [NodeState]] = [:]
        for batch in batches {
            for node in batch.nodes {
                XCTAssertNil(node.result, "events carry no results")
                seen[node.id, default: []].append(node.state)
            }
        }
        XCTAssertEqual(seen.count, 8, "root, the first fetch, the list and its 5 children")
        for (id, states) in seen {
            XCTAssertEqual(states.last, .succeeded, id)
            XCTAssertEqual(states.count, Set(states).count, "\(id): a state is sent once")
        }
        for k in 0..<5 { XCTAssertEqual(seen["root.1.\(k)"], [.running, .succeeded]) }
    }

    /// Events of one flush share the job's version: a stream resumed from that version gets them all again.
    func testResumeFromAVersionSendsEveryNodeChangedAtIt() throws {
        let engine = try makeEngine()
        let fetches = (0..<4).map { _ in #"{"type":"fetch","url":\#(u("/delay/200"))}"# }.joined(separator: ",")
        let job = try submit(engine, #"{"graph":{"type":"list","children":[\#(fetches)]}}"#)
        let first = try collect(engine, id: job.id, after: 0).compactMap { $0 }
        var lastChange: [String: Int64] = [:]
        for batch in first { for node in batch.nodes { lastChange[node.id] = batch.job.version } }
        // Resuming from any version a node changed at sends that node (and those changed later).
        for (id, version) in lastChange {
            let resumed = try collect(engine, id: job.id, after: version).compactMap { $0 }
            XCTAssertTrue(resumed.flatMap { $0.nodes }.contains { $0.id == id }, "\(id) changed at \(version)")
        }
    }

    func testSettledJobIsOneLastBatchAndResumeSendsItsNodes() throws {
        let engine = try makeEngine()
        let job = try submit(engine, #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/json"))},{"type":"fetch","url":\#(u("/json"))}]}}"#)
        let settled = try waitSettled(engine, job.id)
        let plain = try collect(engine, id: job.id, after: nil)
        XCTAssertEqual(plain.count, 1)
        XCTAssertEqual(plain.first??.isLast, true)
        XCTAssertEqual(plain.first??.job.state, .succeeded)
        XCTAssertEqual(plain.first??.nodes.count, 0, "without a version to resume from, no nodes")
        let resumed = try collect(engine, id: job.id, after: 1)
        XCTAssertEqual(Set(resumed.first??.nodes.map { $0.id } ?? []), ["root", "root.0", "root.1"])
        let current = try collect(engine, id: job.id, after: settled.version + 1)
        XCTAssertEqual(current.first??.nodes.count, 0, "nothing changed after the job's last version")
        let last = try collect(engine, id: job.id, after: settled.version)
        XCTAssertTrue(last.first??.nodes.contains { $0.id == "root" } == true,
                      "the last version's events again: a client may have missed some")
    }

    func testUnknownJobIsNil() throws {
        let engine = try makeEngine()
        let batches = try collect(engine, id: "01NOSUCHJOB", after: nil)
        XCTAssertEqual(batches.count, 1)
        XCTAssertNil(batches.first ?? nil)
    }
}
