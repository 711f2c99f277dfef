import Foundation
import TestSupport
import Threads
import XCTest
@testable import JobCore

/// A large job that only reads starts as its creation is written (`Engine.startsBeforeCommit`): its answer still
/// waits for the commit, nothing of it reaches the store or a reader before that, and a creation that fails drops it
/// without a trace. The creations are held by the store (`ForwardingStore.creating`) until each test lets them go.
final class EngineStartBeforeCommitTests: EngineTestCase {
    private typealias Held = (job: JobRecord, forward: @Sendable () -> Void, completion: ForwardingStore.CreateCompletion)

    /// An engine that starts jobs of two nodes or more before their commit, and whose store holds each creation in
    /// `held` until the test forwards or answers it.
    private func holdingEngine(_ held: Watched<[Held]>) throws -> Engine {
        try makeEngine(configure: { $0.startBeforeCommitNodes = 2 }, store: { base in
            ForwardingStore(base: base, creating: { job, forward, completion in
                held.withLock { $0.append((job, forward, completion)) }
            })
        })
    }

    /// Submits `body` without waiting; its answers go to `answers`.
    private func submitLater(_ engine: Engine, _ body: String, _ answers: Watched<[Result<SubmitOutcome, Error>]>) throws {
        let json = try JSONValue.parse(body)
        engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) { answer in
            answers.withLock { $0.append(answer) }
        }
    }

    /// Asks for the engine's metrics until `accept` holds of them (at most 10 s): a run not yet committed has no
    /// long-poll to wait on.
    private func untilMetrics(_ engine: Engine, _ accept: (EngineMetrics) -> Bool) throws -> Bool {
        let deadline = Date().addingTimeInterval(10)
        for _ in 0..<1_000_000 where Date() < deadline {
            if accept(try engine.metricsNow) { return true }
        }
        return false
    }

    func testAJobThatSettlesBeforeItsCommitIsShownAndWrittenOnlyOnceCommitted() throws {
        let held = Watched<[Held]>([])
        let engine = try holdingEngine(held)
        let key = "early-\(UUID().uuidString)"
        let answers = Watched<[Result<SubmitOutcome, Error>]>([])
        let fetch = #"{"type":"fetch","url":"\#(upstream.url("/count/\(key)"))"}"#
        try submitLater(engine, #"{"graph":{"type":"list","children":[\#(fetch),\#(fetch),\#(fetch)]}}"#, answers)

        // Its fetches run, and the job settles, while its creation waits.
        try upstream.waitForStats("the three fetches") { $0["counters"]?[key]?.intValue == 3 }
        XCTAssertTrue(held.wait(milliseconds: 10_000) { $0.count == 1 })
        XCTAssertTrue(try untilMetrics(engine) { $0.activeJobs == 0 && $0.nodesByState[.succeeded] == 4 })
        let id = held.withLock { $0[0].job.id }
        XCTAssertEqual(answers.withLock { $0.count }, 0, "answered before the creation committed")
        XCTAssertNil(try engine.job(id: id), "a long-poll found the job before its creation committed")
        let read = try engine.answer("read of \(id)") { done in engine.readJob(id: id) { done($0) } }.get()
        guard case .notFound = read else { return XCTFail("a read found the job before its creation committed: \(read)") }
        let cancel = try engine.answer("cancel") { done in engine.cancel(id: id) { done($0) } }
        guard case .success(.notFound) = cancel else { return XCTFail("cancel answered \(cancel)") }
        try engine.store.flush()
        XCTAssertNil(try engine.store.job(id: id))
        XCTAssertEqual(try engine.store.nodes(jobID: id, includeResults: false).count, 0, "node rows written before the job's")

        held.withLock { $0[0] }.forward()
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 1 })
        guard case .success(.created(let created))? = answers.withLock({ $0.first }) else {
            return XCTFail("submit answered \(String(describing: answers.withLock { $0.first }))")
        }
        XCTAssertEqual(created.id, id)
        XCTAssertEqual(created.state, .succeeded, "the answer shows the job as it is")
        XCTAssertEqual(try settled(engine, id).state, .succeeded)
        XCTAssertEqual(try storedStates(engine, id), [.succeeded, .succeeded, .succeeded, .succeeded])
        XCTAssertEqual(try engine.store.job(id: id)?.state, .succeeded)
    }

    func testAJobWhoseCreationFailsAfterItStartedIsDroppedUnwritten() throws {
        let held = Watched<[Held]>([])
        let engine = try holdingEngine(held)
        let key = "dropped-\(UUID().uuidString)"
        let answers = Watched<[Result<SubmitOutcome, Error>]>([])
        try submitLater(engine, """
            {"graph":{"type":"list","children":[
              {"type":"fetch","url":"\(upstream.url("/count/\(key)"))"},{"type":"fetch","url":"\(upstream.url("/hang"))"}]}}
            """, answers)
        try upstream.waitForStats("the fetches") { $0["counters"]?[key]?.intValue == 1 && $0["active"]?.intValue == 1 }
        XCTAssertTrue(held.wait(milliseconds: 10_000) { $0.count == 1 })
        let id = held.withLock { $0[0].job.id }
        XCTAssertTrue(try untilMetrics(engine) { $0.activeJobs == 1 && $0.nodesByState[.succeeded] == 1 })

        held.withLock { $0[0] }.completion(.failure(StoreError(.full, "database or disk is full")))
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 1 })
        guard case .failure(let error as StoreError)? = answers.withLock({ $0.first }) else {
            return XCTFail("submit answered \(String(describing: answers.withLock { $0.first }))")
        }
        XCTAssertEqual(error.kind, .full)
        // The transfer still running is ended, and nothing of the job is left: not in memory, not in the counts,
        // not in the store.
        try upstream.waitForStats("the hanging fetch's end") { $0["active"]?.intValue == 0 }
        XCTAssertNil(try engine.job(id: id))
        let metrics = try engine.metricsNow
        XCTAssertEqual(metrics.activeJobs, 0)
        XCTAssertEqual(metrics.activeNodes, 0)
        XCTAssertEqual(metrics.jobsByState.values.reduce(0, +), 0, "\(metrics.jobsByState)")
        XCTAssertEqual(metrics.nodesByState.values.reduce(0, +), 0, "\(metrics.nodesByState)")
        try engine.store.flush()
        XCTAssertNil(try engine.store.job(id: id))
        XCTAssertEqual(try engine.store.nodes(jobID: id, includeResults: false).count, 0)

        // The next submission is taken as any other.
        try submitLater(engine, #"{"graph":{"type":"list","children":[{"type":"fetch","url":"\#(upstream.url("/json"))"},{"type":"fetch","url":"\#(upstream.url("/json"))"}]}}"#, answers)
        XCTAssertTrue(held.wait(milliseconds: 10_000) { $0.count == 2 })
        held.withLock { $0[1] }.forward()
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 2 })
        guard case .success(.created(let next))? = answers.withLock({ $0.last }) else {
            return XCTFail("submit answered \(String(describing: answers.withLock { $0.last }))")
        }
        XCTAssertEqual(try settled(engine, next.id).state, .succeeded)
    }

    /// Which jobs start before their commit: large enough, on one server, and doing nothing but read.
    func testOnlyJobsThatOnlyReadStartBeforeTheirCommit() throws {
        let engine = try makeEngine(configure: { $0.startBeforeCommitNodes = 3 })
        let get = #"{"type":"fetch","url":"http://127.0.0.1:1/a"}"#
        func list(_ children: String...) -> String { #"{"type":"list","children":[\#(children.joined(separator: ","))]}"# }
        func fetch(_ fields: String) -> String { #"{"type":"fetch","url":"http://127.0.0.1:1/a",\#(fields)}"# }
        let rows: [(what: String, graph: String, extra: String, starts: Bool)] = [
            ("a list of GETs", list(get, get), "", true),
            ("a sequence of GETs", #"{"type":"sequence","children":[\#(get),\#(get)]}"#, "", true),
            ("a GET and a HEAD", list(get, fetch(#""method":"HEAD""#)), "", true),
            ("fewer nodes than the bound", list(get), "", false),
            ("a POST among them", list(get, fetch(#""method":"POST""#)), "", false),
            ("a PUT among them", list(get, fetch(#""method":"PUT""#)), "", false),
            ("a GET that joins others' transfers", list(get, fetch(#""coalesce":true"#)), "", false),
            ("a GET that uses the cache", list(get, fetch(#""cache":"use""#)), "", false),
            ("a map", list(get, #"{"type":"map","items":[1],"template":\#(get)}"#), "", false),
            ("a concurrency key", list(get, get), #","concurrency_key":"k""#, false),
        ]
        for row in rows {
            let spec = try JobSpec.parse(try JSONValue.parse(#"{"graph":\#(row.graph)\#(row.extra)}"#))
            XCTAssertEqual(engine.startsBeforeCommit(spec), row.starts, row.what)
        }
    }
}
