import Foundation
import TestSupport
import Threads
import XCTest

@testable import JobCore

/// The engine's rules (API.md §1.2–1.3), each run against real fetches to the local upstream.
class EngineTests: EngineTestCase {
    // MARK: - Helpers

    /// The upstream's URL for `path`, as a JSON string literal.
    func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    func nodes(_ engine: Engine, _ id: String) throws -> [String: NodeRecord] {
        let list = try engine.nodes(jobID: id, includeResults: true) ?? []
        return Dictionary(uniqueKeysWithValues: list.map { ($0.id, $0) })
    }

    /// Cancels and waits (at most 10 s) for the engine's answer.
    func cancel(_ engine: Engine, _ id: String) throws -> CancelOutcome {
        try engine.answer("cancel of \(id)") { done in engine.cancel(id: id) { done($0) } }.get()
    }

    /// Waits (at most `seconds`) until `condition` holds for the job's nodes, looking at each change of the job.
    func waitForNodes(
        _ engine: Engine, _ id: String, seconds: Double = 10, _ condition: ([String: NodeRecord]) -> Bool
    ) throws -> [String: NodeRecord] {
        var current: [String: NodeRecord] = [:]
        if try untilJob(engine, id, seconds: seconds, {
            current = try nodes(engine, id)
            return condition(current)
        }) {
            return current
        }
        throw UpstreamError("the nodes of job \(id) did not reach the expected states within \(seconds) s")
    }

    func run(_ engine: Engine, _ graph: String, extra: String = "") throws -> (JobRecord, [String: NodeRecord]) {
        let job = try submit(engine, #"{"graph": \#(graph)\#(extra)}"#)
        let done = try settled(engine, job.id)
        return (done, try nodes(engine, job.id))
    }

    // MARK: - Finished fetches

    /// Fetches that end while an earlier one waits to be taken in join its turn of the engine's queue, in the order
    /// they ended, ahead of work queued between them: one hop per batch, not one per fetch.
    func testFetchesThatEndWhileOneWaitsAreTakenInOnItsTurn() throws {
        let engine = try makeEngine()
        let seen = Locked<[String]>([])
        engine.queue.suspend()
        engine.fetchEnded(slotOf: nil) { seen.withLock { $0.append("a") } }
        engine.queue.async { seen.withLock { $0.append("queued between") } }
        engine.fetchEnded(slotOf: nil) { seen.withLock { $0.append("b") } }
        engine.fetchEnded(slotOf: nil) { seen.withLock { $0.append("c") } }
        engine.queue.resume()
        engine.queue.sync {}
        // The next fetch to end starts a turn of its own.
        engine.fetchEnded(slotOf: nil) { seen.withLock { $0.append("d") } }
        engine.queue.sync {}
        XCTAssertEqual(seen.withLock { $0 }, ["a", "b", "c", "queued between", "d"])
    }

    // MARK: - Reads of settled jobs

    func testReadsOfAStoredJobMeanwhileJoinTheOneUnderWayAndShareItsAnswer() throws {
        // Answers are kept only up to 1 KiB; each is made by a render that waits for the test's word.
        let renders = Watched(0)
        let gate = DispatchSemaphore(value: 0)
        let engine = try makeEngine(configure: { $0.settledCacheBytes = 8 << 10 }, renderSettled: { job in
            renders.withLock { $0 += 1 }
            gate.wait()
            return Array(repeating: UInt8(ascii: "x"), count: 4000) + Array(job.id.utf8)
        })
        // Renders this test did not expect are let through at its end, rather than left waiting.
        defer { for _ in 0..<3 { gate.signal() } }
        let id = try submitAndRetire(engine, #"{"graph":{"type":"fetch","url":\#(u("/json"))}}"#)

        let shared = threeReadsJoined(id, renders: renders, gate: gate, reads: engine.storedReads, {
            engine.readJob(id: id, $0)
        }) { read in
            guard case .settled(let job) = read else { return nil }
            return job.answer
        }

        // A read while one still holds that answer shares it without a render. (Servers sharing PostgreSQL drop what
        // they keep of a job whenever the store announces a change of it, which may come late.)
        guard !Self.usesPostgres else { return }
        let again = try engine.answer("read of \(id)") { done in engine.readJob(id: id) { done($0) } }.get()
        guard case .settled(let held) = again else { return XCTFail("not a settled answer: \(again)") }
        XCTAssertTrue(held.answer === shared.first)
        XCTAssertEqual(renders.withLock { $0 }, 1)
    }

    func testReadsOfAStoredJobsNodesWithResultsJoinAndShareOneShownList() throws {
        let renders = Watched(0)
        let gate = DispatchSemaphore(value: 0)
        let engine = try makeEngine(renderNodeList: { nodes in
            renders.withLock { $0 += 1 }
            gate.wait()
            return Array(nodes.map(\.id).joined(separator: ",").utf8)
        })
        defer { for _ in 0..<3 { gate.signal() } }
        let graph = #"{"graph":{"type":"list","children":[{"id":"a","type":"fetch","url":\#(u("/json"))}]}}"#
        // A job still running has its nodes read as records, which the caller shows.
        let running = try submit(engine, #"{"graph":{"type":"fetch","url":\#(u("/hang"))}}"#).id
        guard case .nodes(let live) = try nodeList(engine, running, includeResults: true) else {
            return XCTFail("a running job's nodes are not records")
        }
        XCTAssertEqual(live.map(\.id), ["root"])
        let id = try submitAndRetire(engine, graph)
        guard case .nodes(let light) = try nodeList(engine, id, includeResults: false) else {
            return XCTFail("nodes without results are not records")
        }
        XCTAssertEqual(light.map(\.id), ["root", "a"])
        XCTAssertEqual(renders.withLock { $0 }, 0)

        let shown = threeReadsJoined(id, renders: renders, gate: gate, reads: engine.storedNodeLists, {
            engine.nodeList(jobID: id, includeResults: true, $0)
        }) { read in
            guard case .shown(let answer) = read else { return nil }
            return answer
        }
        XCTAssertEqual(shown.first.map { String(decoding: $0.bytes, as: UTF8.self) }, "root,a")
        guard !Self.usesPostgres else { return }
        guard case .shown(let held) = try nodeList(engine, id, includeResults: true) else {
            return XCTFail("not the shown list")
        }
        XCTAssertTrue(held === shown.first, "a read while it is held shares it")
        XCTAssertEqual(renders.withLock { $0 }, 1)
        // Deleted: the list held is no longer found.
        guard case .deleted = try engine.delete(id: id) else { return XCTFail("not deleted") }
        XCTAssertNil(engine.settledJobs.nodeList(of: id))
        guard case .notFound = try nodeList(engine, id, includeResults: true) else { return XCTFail("found once deleted") }
    }

    /// A large run leaving memory, and a large answer made from the store (a job's, or its nodes' with results), ask
    /// for what they freed to be given back; smaller ones do not.
    func testLargeRunsLeavingAndLargeAnswersFromTheStoreAskForTheirMemoryBack() throws {
        let engine = try makeEngine(
            renderSettled: { job in Array(#"{"id":"\#(job.id)"}"#.utf8) },
            renderNodeList: { nodes in Array(nodes.map(\.id).joined(separator: ",").utf8) })
        let memory = engine.memoryReturn
        memory.minNodes = 3
        memory.minAnswerBytes = .max
        memory.quietMs = 0
        func list(_ n: Int) -> String {
            let child = #"{"type":"fetch","url":\#(u("/json"))}"#
            return #"{"graph":{"type":"list","children":["# + Array(repeating: child, count: n).joined(separator: ",") + "]}}"
        }
        // The run's leaving is counted once it is let go of, on the release queue: the turn that forgot it, which
        // `submitAndRetire` has seen end, queued that.
        let small = try submitAndRetire(engine, list(1))
        engine.releaseQueue.sync {}
        XCTAssertFalse(memory.isPending, "a run of two nodes")
        let large = try submitAndRetire(engine, list(2))
        engine.releaseQueue.sync {}
        XCTAssertTrue(memory.waitFor(trims: 1, milliseconds: 10_000), "a run of three nodes")

        guard case .settled = try readJob(engine, small) else { return XCTFail("not the settled answer") }
        XCTAssertFalse(memory.isPending, "a small answer")
        memory.minAnswerBytes = 1
        guard case .settled = try readJob(engine, large) else { return XCTFail("not the settled answer") }
        XCTAssertTrue(memory.waitFor(trims: 2, milliseconds: 10_000), "a large answer")
        guard case .shown = try nodeList(engine, large, includeResults: true) else { return XCTFail("not shown") }
        XCTAssertTrue(memory.waitFor(trims: 3, milliseconds: 10_000), "a large node list")
    }

    /// A run that left memory is freed on the engine's release queue, not on the store's writer or the engine's
    /// queue, whichever let go of it last: a large run is millions of allocations, and both of those are waited on.
    func testARunThatLeftMemoryIsFreedOnTheReleaseQueue() throws {
        let engine = try makeEngine()
        engine.releaseQueue.suspend()
        var suspended = true
        defer { if suspended { engine.releaseQueue.resume() } }
        let child = #"{"type":"fetch","url":\#(u("/hang"))}"#
        let id = try submit(engine, #"{"graph":{"type":"list","children":[\#(child),\#(child)]}}"#).id
        weak let run = engine.queue.sync { engine.runs[id] }
        XCTAssertNotNil(run, "the run in memory")
        _ = try engine.answer("cancel \(id)") { done in engine.cancel(id: id) { done($0) } }.get()
        // The turn that forgot the run, seen to end here, queued its release.
        waitUntilLeftMemory(engine, id)
        XCTAssertNotNil(run, "the run is held for the release queue")
        engine.releaseQueue.resume()
        suspended = false
        engine.releaseQueue.sync {}
        XCTAssertNil(run, "the run is freed on the release queue")
    }

    /// A large run that is running holds back the trim of what other work freed: it may take the pages up again.
    func testALargeRunningJobHoldsBackTheTrimUntilItLeavesMemory() throws {
        let engine = try makeEngine()
        let memory = engine.memoryReturn
        memory.minNodes = 3
        memory.quietMs = 0
        let child = #"{"type":"fetch","url":\#(u("/hang"))}"#
        let id = try submit(engine, #"{"graph":{"type":"list","children":[\#(child),\#(child)]}}"#).id
        engine.queue.sync {}
        memory.bulkFreed()
        XCTAssertTrue(memory.waitFor(checks: 1, milliseconds: 10_000))
        XCTAssertEqual(memory.trims, 0, "held back while the job runs")
        _ = try engine.answer("cancel \(id)") { done in engine.cancel(id: id) { done($0) } }.get()
        XCTAssertTrue(memory.waitFor(trims: 1, milliseconds: 10_000), "given back once the job left memory")
    }

    private func readJob(_ engine: Engine, _ id: String) throws -> JobRead {
        try engine.answer("job \(id)") { done in engine.readJob(id: id) { done($0) } }.get()
    }

    /// Starts three reads of `id` with `start`, the first held in its render (counted by `renders`, let go by `gate`
    /// once the other two have joined it in `reads`), and gives the answers of the three: one object, made once.
    private func threeReadsJoined<Read: Sendable>(
        _ id: String, renders: Watched<Int>, gate: DispatchSemaphore, reads: JoinedReads<Read>,
        _ start: @escaping @Sendable (@escaping @Sendable (Result<Read, Error>) -> Void) -> Void,
        answer: (Read) -> SettledAnswer?, file: StaticString = #filePath, line: UInt = #line
    ) -> [SettledAnswer] {
        let answers = Watched<[Read]>([])
        let read: @Sendable () -> Void = {
            start { result in
                if let found = try? result.get() { answers.withLock { $0.append(found) } }
            }
        }
        read()
        XCTAssertTrue(renders.wait(milliseconds: 10_000) { $0 == 1 }, "the first read makes the answer", file: file, line: line)
        read()
        read()
        XCTAssertTrue(reads.underWay.wait(milliseconds: 10_000) { $0[id]?.count == 2 }, "the others join it", file: file, line: line)
        gate.signal()
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 3 }, file: file, line: line)
        let shared = answers.withLock { $0 }.compactMap(answer)
        XCTAssertEqual(shared.count, 3, file: file, line: line)
        XCTAssertTrue(shared.allSatisfy { $0 === shared.first }, "one answer for the three", file: file, line: line)
        XCTAssertEqual(renders.withLock { $0 }, 1, file: file, line: line)
        XCTAssertEqual(reads.underWay.withLock { $0.count }, 0, file: file, line: line)
        return shared
    }

    private func nodeList(_ engine: Engine, _ id: String, includeResults: Bool) throws -> NodeListRead {
        try engine.answer("nodes of \(id)") { done in
            engine.nodeList(jobID: id, includeResults: includeResults) { done($0) }
        }.get()
    }

    /// Submits `body`, waits until the job has succeeded and has left memory (once its last state is committed):
    /// from then on it is read from the store.
    private func submitAndRetire(_ engine: Engine, _ body: String) throws -> String {
        let id = try submit(engine, body).id
        XCTAssertEqual(try settled(engine, id).state, .succeeded)
        waitUntilLeftMemory(engine, id)
        return id
    }

    /// Waits, a commit at a time, until the settled job `id` has left the engine's memory.
    private func waitUntilLeftMemory(_ engine: Engine, _ id: String, line: UInt = #line) {
        var inMemory = true
        for _ in 0..<100 where inMemory {
            let committed = DispatchSemaphore(value: 0)
            engine.store.whenCommitted { _ in committed.signal() }
            XCTAssertEqual(committed.wait(timeout: .now() + 10), .success, line: line)
            inMemory = engine.queue.sync { engine.runs[id] != nil }
        }
        XCTAssertFalse(inMemory, "the settled job never left memory", line: line)
    }

    func testAnswersOfLargeStoredJobsAreMadeOneAtATimeWithoutHoldingAThread() throws {
        let engine = try makeEngine(
            configure: {
                $0.largeReadNodes = 3
                $0.settledCacheBytes = 0
            },
            renderSettled: { job in Array(#"{"id":"\#(job.id)"}"#.utf8) },
            renderNodeList: { nodes in Array("[\(nodes.count)]".utf8) })
        let fetch = #"{"type":"fetch","url":\#(u("/json"))}"#
        let large = try submitAndRetire(engine, #"{"graph":{"type":"list","children":[\#(fetch),\#(fetch)]}}"#)
        let other = try submitAndRetire(engine, #"{"graph":{"type":"sequence","children":[\#(fetch),\#(fetch)]}}"#)
        let small = try submitAndRetire(engine, #"{"graph":\#(fetch)}"#)

        // Another large answer in the making holds the one place.
        let held = Locked<Admission.Release?>(nil)
        engine.largeReads.enter { release in held.withLock { $0 = release } }
        let answered = Watched<[String]>([])
        engine.readJob(id: large) { read in
            if case .success(.settled(let job)) = read, job.body == Array(#"{"id":"\#(large)"}"#.utf8) {
                answered.withLock { $0.append("job") }
            }
        }
        engine.nodeList(jobID: other, includeResults: true) { read in
            if case .success(.shown(let shown)) = read, shown.bytes == Array("[3]".utf8) {
                answered.withLock { $0.append("nodes") }
            }
        }
        // Both reads have reached their turn's queue (the engine's queue hands them to read queues).
        engine.queue.sync {}
        for queue in engine.readQueues { queue.sync {} }
        XCTAssertEqual(engine.largeReads.counts.waiting, 2, "both wait for the place")
        XCTAssertEqual(answered.withLock { $0 }, [])
        // A small job's answer does not wait.
        guard case .settled(let job) = try engine.answer("job \(small)", { done in engine.readJob(id: small) { done($0) } }).get()
        else { return XCTFail("the small job not read") }
        XCTAssertEqual(job.body, Array(#"{"id":"\#(small)"}"#.utf8))
        XCTAssertEqual(answered.withLock { $0 }, [])

        let trims = engine.memoryReturn.trims
        held.withLock { $0 }?()
        XCTAssertTrue(answered.wait(milliseconds: 10_000) { Set($0) == ["job", "nodes"] && $0.count == 2 })
        // Each read gives its place back once its completion has run, on its read queue.
        for queue in engine.readQueues { queue.sync {} }
        XCTAssertTrue(engine.largeReads.counts == (0, 0), "\(engine.largeReads.counts)")
        // Between the two, with one still waiting, what the first freed was given back (the held place let go of
        // first had no read of its own).
        XCTAssertEqual(engine.memoryReturn.trims, trims + 1)
    }

    func testLongPollsAJobSatisfiesShareItsAnswerMadeOnceAndKept() throws {
        let renders = Watched(0)
        let engine = try makeEngine(renderSettled: { job in
            renders.withLock { $0 += 1 }
            return Array(#"{"id":"\#(job.id)"}"#.utf8)
        })
        let id = try submit(engine, #"{"graph":{"type":"fetch","url":\#(u("/hang"))}}"#).id
        let answers = Watched<[JobRead]>([])
        let records = Watched<[JobRecord?]>([])
        for _ in 0..<2 {
            engine.waitForAnswer(id: id, afterVersion: nil, timeoutMs: 10_000) { read in answers.withLock { $0.append(read) } }
        }
        engine.waitForChange(id: id, afterVersion: nil, timeoutMs: 10_000) { job in records.withLock { $0.append(job) } }
        guard case .cancelling = try cancel(engine, id) else { return XCTFail("not cancelling") }
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 2 })
        XCTAssertTrue(records.wait(milliseconds: 10_000) { $0.count == 1 })

        let shared = answers.withLock { list in list.compactMap { read -> SettledAnswer? in
            guard case .settled(let job) = read else { return nil }
            return job.answer
        } }
        XCTAssertEqual(shared.count, 2, "both long-polls that take answers get the settled job's answer")
        XCTAssertTrue(shared.count == 2 && shared[0] === shared[1], "one answer for both")
        XCTAssertEqual(renders.withLock { $0 }, 1)
        XCTAssertEqual(records.withLock { $0.first??.state }, .cancelled, "a long-poll that takes records gets the record")
        // Servers sharing PostgreSQL drop a kept answer whenever the store announces a change of the job, which
        // may come after this server's own last write.
        guard !Self.usesPostgres else { return }
        XCTAssertTrue(engine.settledJobs[id]?.answer === shared.first, "kept: a read afterwards makes nothing again")
        let later = try engine.answer("long-poll of \(id)") { done in
            engine.waitForAnswer(id: id, afterVersion: nil, timeoutMs: 10_000) { done($0) }
        }
        guard case .settled(let again) = later else { return XCTFail("not a settled answer: \(later)") }
        XCTAssertTrue(again.answer === shared.first)
        XCTAssertEqual(renders.withLock { $0 }, 1)
    }

    // MARK: - Lists

    func testPlainListSucceedsWithResultsAndErrorEntriesInChildOrder() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"list","children":[
              {"type":"fetch","url":\(u("/status/503"))},
              {"type":"fetch","url":\(u("/json"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        let results = try XCTUnwrap(job.result?.arrayValue)
        XCTAssertEqual(results.count, 2)
        XCTAssertEqual(results[0]["error"]?["kind"], "http_status")
        XCTAssertEqual(results[0]["error"]?["status"], 503)
        XCTAssertEqual(results[0]["error"]?["node"], "root.0")
        XCTAssertEqual(results[1]["status"], 200)
        XCTAssertEqual(results[1]["body"]?["ok"], true)
        XCTAssertEqual(nodes["root.0"]?.state, .failed)
        XCTAssertEqual(nodes["root.0"]?.status, 503)
        XCTAssertEqual(nodes["root.1"]?.state, .succeeded)
        XCTAssertEqual(job.progress.done, 3)
        XCTAssertEqual(job.progress.percent, 100)
    }

    func testConsumeErrorsPutsNullForFailedChildren() throws {
        let engine = try makeEngine()
        let (job, _) = try run(engine, """
            {"type":"list","consume_errors":true,"children":[
              {"type":"fetch","url":\(u("/json"))},
              {"type":"fetch","url":\(u("/status/500"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?.arrayValue?[1], .null)
        XCTAssertEqual(job.result?.arrayValue?[0]["status"], 200)
    }

    func testFireOnFirstResultSucceedsWithTheValueAndCancelsTheRest() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"list","fire_on_first_result":true,"children":[
              {"type":"fetch","url":\(u("/hang"))},
              {"type":"fetch","url":\(u("/status/500"))},
              {"type":"fetch","url":\(u("/delay/300"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?["status"], 200)
        XCTAssertEqual(job.result?["body"]?["delayed_ms"], 300)
        XCTAssertEqual(nodes["root.0"]?.state, .cancelled)
        XCTAssertEqual(nodes["root.0"]?.error?.kind, .cancelled)
        XCTAssertEqual(nodes["root.1"]?.state, .failed)
    }

    func testFireOnFirstResultFailsWithAllFailedWhenEveryChildFails() throws {
        let engine = try makeEngine()
        let (job, _) = try run(engine, """
            {"type":"list","fire_on_first_result":true,"children":[
              {"type":"fetch","url":\(u("/status/500"))},
              {"type":"fetch","url":\(u("/status/404"))}]}
            """)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .allFailed)
        XCTAssertEqual(job.error?.errors?.map(\.status), [500, 404])
        XCTAssertEqual(job.error?.errors?.map(\.node), ["root.0", "root.1"])
    }

    func testFireOnFirstErrorFailsWithTheChildErrorAndAbortsTheSibling() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"list","fire_on_first_error":true,"children":[
              {"id":"slow","type":"fetch","url":\(u("/hang"))},
              {"id":"bad","type":"fetch","url":\(u("/delay/2000?x=1"))},
              {"id":"worse","type":"fetch","url":\(u("/status/502"))}]}
            """)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .httpStatus)
        XCTAssertEqual(job.error?.node, "worse")
        XCTAssertEqual(job.error?.status, 502)
        XCTAssertEqual(nodes["slow"]?.state, .cancelled)
        XCTAssertEqual(nodes["bad"]?.state, .cancelled)
        XCTAssertTrue(try waitForDisconnect(path: "/hang"), "the upstream never saw the aborted transfer")
    }

    func testFireOnFirstErrorSucceedsWithTheArrayWhenAllSucceed() throws {
        let engine = try makeEngine()
        let (job, _) = try run(engine, """
            {"type":"list","fire_on_first_error":true,"children":[
              {"type":"fetch","url":\(u("/json"))},{"type":"fetch","url":\(u("/text"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?.arrayValue?.count, 2)
        XCTAssertEqual(job.result?.arrayValue?[1]["body"], "hello, world")
    }

    func testBothFlagsSettleLikeWhicheverHappensFirst() throws {
        let engine = try makeEngine()
        let (first, _) = try run(engine, """
            {"type":"list","fire_on_first_result":true,"fire_on_first_error":true,"children":[
              {"type":"fetch","url":\(u("/delay/2000"))},{"type":"fetch","url":\(u("/status/500"))}]}
            """)
        XCTAssertEqual(first.state, .failed)
        XCTAssertEqual(first.error?.status, 500)
        let (second, _) = try run(engine, """
            {"type":"list","fire_on_first_result":true,"fire_on_first_error":true,"children":[
              {"type":"fetch","url":\(u("/json"))},{"type":"fetch","url":\(u("/count/late?delay_ms=2000&fail=5"))}]}
            """)
        XCTAssertEqual(second.state, .succeeded)
        XCTAssertEqual(second.result?["status"], 200)
    }

    func testCancelRemainingFalseLetsTheOtherChildrenFinish() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"list","fire_on_first_result":true,"cancel_remaining":false,"children":[
              {"type":"fetch","url":\(u("/json"))},{"type":"fetch","url":\(u("/delay/200"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(nodes["root.1"]?.state, .succeeded)
        XCTAssertEqual(nodes["root.1"]?.result?["body"]?["delayed_ms"], 200)
    }

    func testConcurrencyBoundsChildrenRunningAtOnce() throws {
        let engine = try makeEngine()
        let children = (0..<6).map { _ in #"{"type":"fetch","url":\#(u("/delay/150"))}"# }.joined(separator: ",")
        let (job, _) = try run(engine, #"{"type":"list","concurrency":2,"children":[\#(children)]}"#)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?.arrayValue?.count, 6)
        let stats = try upstream.stats()
        XCTAssertEqual(stats["max_active"]?.intValue, 2)
    }

    func testAListThatFiresEndsTheChildrenWaitingForASlotCancelledWithoutStartingThem() throws {
        let engine = try makeEngine()
        let waiting = (1...4).map { _ in #"{"type":"fetch","url":\#(u("/delay/150"))}"# }
        let children = ([#"{"type":"fetch","url":\#(u("/json"))}"#] + waiting).joined(separator: ",")
        let (job, nodes) = try run(
            engine, #"{"type":"list","concurrency":1,"fire_on_first_result":true,"children":[\#(children)]}"#)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(nodes["root.0"]?.state, .succeeded)
        for k in 1...4 {
            XCTAssertEqual(nodes["root.\(k)"]?.state, .cancelled, "root.\(k)")
            XCTAssertEqual(nodes["root.\(k)"]?.attempts, 0, "root.\(k) never started")
        }
    }

    func testPerHostLimitBoundsTransfersAcrossJobs() throws {
        let engine = try makeEngine { $0.maxPerHost = 3 }
        let children = (0..<8).map { _ in #"{"type":"fetch","url":\#(u("/delay/100"))}"# }.joined(separator: ",")
        let a = try submit(engine, #"{"graph":{"type":"list","children":[\#(children)]}}"#)
        let b = try submit(engine, #"{"graph":{"type":"list","children":[\#(children)]}}"#)
        XCTAssertEqual(try settled(engine, a.id).state, .succeeded)
        XCTAssertEqual(try settled(engine, b.id).state, .succeeded)
        let maxActive = try XCTUnwrap(try upstream.stats()["max_active"]?.intValue)
        XCTAssertLessThanOrEqual(maxActive, 3)
    }

    func testAHostIsHandedTwiceItsSlotsAndTheFetcherRunsNoMoreThanTheSlots() throws {
        let engine = try makeEngine(configure: { $0.maxPerHost = 3 }, fetcher: { $0.maxPerHost = 3 })
        let children = (0..<16).map { _ in #"{"type":"fetch","url":\#(u("/delay/300"))}"# }.joined(separator: ",")
        // One job, so that each count is of one reading of its nodes.
        let job = try submit(engine, #"{"graph":{"type":"list","children":[\#(children)]}}"#)
        // Six handed over: three on the wire, three held by libcurl until a connection is free. With servers
        // sharing a database, whose slots are taken in the store, three only.
        var most = 0
        XCTAssertTrue(
            try untilJob(engine, job.id, seconds: 30) {
                let nodes = try engine.nodes(jobID: job.id, includeResults: false) ?? []
                most = max(most, nodes.filter { $0.id != "root" && $0.state == .running }.count)
                return try engine.job(id: job.id)?.state.isSettled == true
            })
        XCTAssertEqual(most, Self.usesPostgres ? 3 : 6)
        XCTAssertEqual(try settled(engine, job.id).state, .succeeded)
        let stats = try upstream.stats()
        XCTAssertEqual(stats["max_active"]?.intValue, 3)
        XCTAssertEqual(stats["requests"]?.intValue, 16)
    }

    func testFetchesHeldForOneHostDoNotWaitForAnotherHostsTransfers() throws {
        let engine = try makeEngine(configure: { $0.maxPerHost = 2 }, fetcher: { $0.maxPerHost = 2 })
        // Two hosts as libcurl counts them: 127.0.0.1 and localhost. The first's transfers hang, with two more held.
        let hanging = (0..<6).map { _ in #"{"type":"fetch","url":\#(u("/hang"))}"# }.joined(separator: ",")
        let a = try submit(engine, #"{"graph":{"type":"list","children":[\#(hanging)]}}"#)
        let handedOver = Self.usesPostgres ? 2 : 4  // shared slots are never held
        XCTAssertTrue(
            try untilJob(engine, a.id) {
                let nodes = try engine.nodes(jobID: a.id, includeResults: false) ?? []
                return nodes.filter { $0.id != "root" && $0.state == .running }.count == handedOver
            })
        let url = "\"" + upstream.url("/delay/10").replacingOccurrences(of: "127.0.0.1", with: "localhost") + "\""
        let quick = (0..<4).map { _ in #"{"type":"fetch","url":\#(url)}"# }.joined(separator: ",")
        let b = try submit(engine, #"{"graph":{"type":"list","children":[\#(quick)]}}"#)
        XCTAssertEqual(try settled(engine, b.id).state, .succeeded, "the second host's held fetches ran")
        XCTAssertEqual(try engine.job(id: a.id)?.state, .running)
    }

    /// A running job keeps no more of its submitted request than its `notify` URL, from which reads show its
    /// delivery pending; a job without `notify` keeps none of it.
    func testARunningJobKeepsOnlyTheNotifyURLOfItsRequest() throws {
        let engine = try makeEngine()
        let hang = #"{"type":"fetch","url":\#(u("/hang"))}"#
        let with = try submit(engine, #"{"graph":\#(hang),"notify":{"url":"https://hooks.local/x"}}"#)
        let without = try submit(engine, #"{"graph":\#(hang)}"#)
        XCTAssertEqual(try engine.job(id: with.id)?.notifyURL, "https://hooks.local/x")
        XCTAssertEqual(try engine.job(id: with.id)?.request, .object(["notify": .object(["url": "https://hooks.local/x"])]))
        XCTAssertEqual(try engine.job(id: without.id)?.request, .null)
        XCTAssertNil(try engine.job(id: without.id)?.notifyURL)
    }

    // MARK: - Sequences

    func testSequenceSucceedsWithTheArrayInOrder() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"sequence","children":[
              {"type":"fetch","url":\(u("/count/seq"))},{"type":"fetch","url":\(u("/count/seq"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?.arrayValue?.map { $0["body"]?["count"] }, [1, 2])
        let first = try XCTUnwrap(nodes["root.0"]?.finishedAt)
        let second = try XCTUnwrap(nodes["root.1"]?.startedAt)
        XCTAssertLessThanOrEqual(first, second)
    }

    func testSequenceStopsAtTheFirstFailureAndSkipsTheRest() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"sequence","children":[
              {"type":"fetch","url":\(u("/json"))},
              {"type":"fetch","url":\(u("/status/500"))},
              {"type":"list","children":[{"type":"fetch","url":\(u("/count/never"))}]}]}
            """)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.node, "root.1")
        XCTAssertEqual(nodes["root.2"]?.state, .skipped)
        XCTAssertEqual(nodes["root.2.0"]?.state, .skipped)
        XCTAssertEqual(job.progress.skipped, 2)
        XCTAssertNil(try upstream.stats()["counters"]?["never"])
    }

    func testSequenceContinueOnErrorKeepsGoing() throws {
        let engine = try makeEngine()
        let (job, _) = try run(engine, """
            {"type":"sequence","continue_on_error":true,"children":[
              {"type":"fetch","url":\(u("/status/500"))},{"type":"fetch","url":\(u("/json"))}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?.arrayValue?[0]["error"]?["status"], 500)
        XCTAssertEqual(job.result?.arrayValue?[1]["status"], 200)
    }

    // MARK: - Timeouts, deadlines, recover, cancel

    func testNodeTimeoutFailsTheNodeAndCancelsItsDescendants() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"list","timeout_ms":300,"children":[
              {"type":"fetch","url":\(u("/hang"))},
              {"type":"sequence","children":[{"type":"fetch","url":\(u("/hang"))},{"type":"fetch","url":\(u("/json"))}]}]}
            """)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .timeout)
        XCTAssertEqual(job.error?.node, "root")
        for id in ["root.0", "root.1", "root.1.0", "root.1.1"] {
            XCTAssertEqual(nodes[id]?.state, .cancelled, id)
        }
    }

    func testDeadlineFailsTheJobWithTimeout() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, #"{"type":"list","children":[{"type":"fetch","url":\#(u("/hang"))}]}"#,
                                   extra: #","deadline_ms":300"#)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .timeout)
        XCTAssertEqual(nodes["root.0"]?.state, .cancelled)
        let elapsed = try XCTUnwrap(job.finishedAt) - job.createdAt
        XCTAssertGreaterThanOrEqual(elapsed, 290)
    }

    func testRecoverTurnsAFailureIntoItsValue() throws {
        let engine = try makeEngine()
        let (job, nodes) = try run(engine, """
            {"type":"list","fire_on_first_error":true,"children":[
              {"type":"fetch","url":\(u("/status/503")),"recover":{"fallback":true}},
              {"type":"fetch","url":\(u("/hang")),"timeout_ms":100,"recover":null}]}
            """)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result, .array([.object(["fallback": true]), .null]))
        XCTAssertEqual(nodes["root.0"]?.recovered, true)
        XCTAssertEqual(nodes["root.0"]?.state, .succeeded)
        XCTAssertEqual(nodes["root.1"]?.recovered, true)
    }

    func testCancelReachesEveryUnsettledNodeAndAbortsTransfers() throws {
        let engine = try makeEngine()
        let job = try submit(engine, """
            {"graph":{"type":"sequence","children":[
              {"type":"list","children":[{"type":"fetch","url":\(u("/hang"))},{"type":"fetch","url":\(u("/json"))}]},
              {"type":"fetch","url":\(u("/json"))}]}}
            """)
        _ = try waitForNodes(engine, job.id) { $0["root.0.1"]?.state == .succeeded && $0["root.0.0"]?.state == .running }
        // Running is the transfer handed to libcurl; the upstream sees the abort only of a request that reached it.
        try upstream.waitForStats("the /hang request at the upstream") { $0["max_active_by_path_prefix"]?["/hang"]?.intValue == 1 }
        guard case .cancelling = try cancel(engine, job.id) else { return XCTFail("not cancelling") }
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .cancelled)
        XCTAssertEqual(done.error?.kind, .cancelled)
        let nodes = try nodes(engine, job.id)
        XCTAssertEqual(nodes["root.0.0"]?.state, .cancelled)
        XCTAssertEqual(nodes["root.0.1"]?.state, .succeeded)
        XCTAssertEqual(nodes["root.1"]?.state, .cancelled)
        XCTAssertTrue(try waitForDisconnect(path: "/hang"))
        guard case .alreadyCancelled = try cancel(engine, job.id) else { return XCTFail("second cancel") }
    }

    func testVersionGrowsWithEveryNodeChangeAndLongPollSeesIt() throws {
        let engine = try makeEngine()
        let job = try submit(engine, #"{"graph":{"type":"fetch","url":\#(u("/delay/200"))}}"#)
        let changed = try engine.answer("a change after version 2") { done in
            _ = engine.waitForChange(id: job.id, afterVersion: 2, timeoutMs: 5000) { done($0) }
        }
        XCTAssertGreaterThan(changed?.version ?? 0, 2)
        let final = try settled(engine, job.id)
        XCTAssertEqual(final.state, .succeeded)
        XCTAssertGreaterThanOrEqual(final.version, 3)
    }

    func testIdempotencyKeyReturnsTheFirstJob() throws {
        let engine = try makeEngine()
        let body = #"{"graph":{"type":"fetch","url":\#(u("/json"))}}"#
        let spec = try JobSpec.parse(try JSONValue.parse(body))
        guard case .created(let first) = try engine.submit(spec, request: try JSONValue.parse(body), idempotencyKey: "k1"),
            case .existing(let again) = try engine.submit(spec, request: try JSONValue.parse(body), idempotencyKey: "k1")
        else { return XCTFail("expected created then existing") }
        XCTAssertEqual(first.id, again.id)
        let other = #"{"graph":{"type":"fetch","url":\#(u("/text"))}}"#
        guard case .conflict = try engine.submit(try JobSpec.parse(try JSONValue.parse(other)), request: try JSONValue.parse(other), idempotencyKey: "k1")
        else { return XCTFail("expected conflict") }
    }

    func testQueueFullRefusesSubmissions() throws {
        let engine = try makeEngine { $0.maxActiveJobs = 1 }
        let body = #"{"graph":{"type":"fetch","url":\#(u("/hang"))}}"#
        let job = try submit(engine, body)
        let spec = try JobSpec.parse(try JSONValue.parse(body))
        guard case .queueFull = try engine.submit(spec, request: try JSONValue.parse(body), idempotencyKey: nil)
        else { return XCTFail("expected queueFull") }
        _ = try cancel(engine, job.id)
    }

    // MARK: - Durable submissions

    func testASubmissionIsAnsweredOnlyOnceItsJobIsCommittedAndHoldsNoThreadMeanwhile() throws {
        let engine = try makeEngine()
        let json = try JSONValue.parse(#"{"graph":{"type":"fetch","url":\#(u("/json"))}}"#)
        let spec = try JobSpec.parse(json)
        // While another connection holds the write lock the store cannot commit: no answer may come, and every call
        // returns at once (a submission that waited for its commit would hold this thread at the first).
        let release = try holdWriteLock()
        // Each answer with the job as the store held it when the answer came.
        let answers = Watched<[(Result<SubmitOutcome, Error>, JobRecord?)]>([])
        for _ in 0..<20 {
            engine.submit(spec, request: json, idempotencyKey: nil) { outcome in
                var job: JobRecord?
                if case .success(.created(let created)) = outcome { job = (try? engine.store.job(id: created.id)) ?? nil }
                answers.withLock { $0.append((outcome, job)) }
            }
        }
        XCTAssertEqual(answers.withLock { $0.count }, 0, "a submission was answered before the store could commit")
        try release()
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 20 })
        for (answer, job) in answers.withLock({ $0 }) {
            guard case .success(.created(let created)) = answer else { return XCTFail("submit answered \(answer)") }
            // What the store holds at the moment the answer is given: a crash right after must not undo it.
            XCTAssertEqual(job?.id, created.id, "job \(created.id) was answered before its row was committed")
            XCTAssertEqual(try settled(engine, created.id).state, .succeeded)
        }
    }

    // MARK: - Durable cancel and delete

    func testCancelAnswersOnlyOnceTheCancelledStatesAreCommitted() throws {
        let engine = try makeEngine()
        var ids: [String] = []
        for _ in 0..<5 {
            let job = try submit(engine, """
                {"graph":{"type":"sequence","children":[
                  {"type":"list","children":[{"type":"fetch","url":\(u("/hang"))},{"type":"fetch","url":\(u("/hang"))}]},
                  {"type":"fetch","url":\(u("/json"))}]}}
                """)
            ids.append(job.id)
        }
        for id in ids { _ = try waitForNodes(engine, id) { $0["root.0.1"]?.state == .running } }
        // While another connection holds the write lock the store cannot commit: no answer may come.
        let release = try holdWriteLock()
        let early = Box<Result<CancelOutcome, Error>?>(nil)
        let earlyDone = DispatchSemaphore(value: 0)
        engine.cancel(id: ids[0]) { outcome in
            early.value = outcome
            earlyDone.signal()
        }
        XCTAssertNil(early.value, "cancel answered before the store could commit")
        XCTAssertEqual(try engine.store.job(id: ids[0])?.state, .running)
        try release()
        XCTAssertEqual(earlyDone.wait(timeout: .now() + 10), .success)
        guard case .success(.cancelling) = early.value else { return XCTFail("first cancel: \(String(describing: early.value))") }
        XCTAssertEqual(try engine.store.job(id: ids[0])?.state, .cancelled)
        for id in ids.dropFirst() {
            // What the store holds at the moment the answer is given: a crash right after must not undo it.
            let done = DispatchSemaphore(value: 0)
            let seen = Box<(JobRecord?, [NodeRecord])?>(nil)
            let answer = Box<Result<CancelOutcome, Error>?>(nil)
            engine.cancel(id: id) { outcome in
                let stored = (try? engine.store.job(id: id)) ?? nil
                seen.value = (stored, (try? engine.store.nodes(jobID: id, includeResults: false)) ?? [])
                answer.value = outcome
                done.signal()
            }
            XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
            guard case .success(.cancelling(let job)) = answer.value else { return XCTFail("cancel answered \(String(describing: answer.value))") }
            XCTAssertEqual(job.state, .cancelled)
            XCTAssertEqual(seen.value?.0?.state, .cancelled, "job \(id) was answered before its cancel was committed")
            let unsettled = (seen.value?.1 ?? []).filter { !$0.state.isSettled }.map(\.id)
            XCTAssertEqual(unsettled, [], "nodes of job \(id) not committed as settled at the answer")
            XCTAssertEqual(seen.value?.1.count, 5)
        }
        XCTAssertEqual(try cancel(engine, ids[0]).isAlreadyCancelled, true)
    }

    func testDeleteHoldsNoThreadAndAnswersOnlyOnceTheDeletionIsCommitted() throws {
        let engine = try makeEngine()
        var ids: [String] = []
        for _ in 0..<3 {
            let job = try submit(engine, #"{"graph":{"type":"fetch","url":\#(u("/json"))}}"#)
            _ = try settled(engine, job.id)
            ids.append(job.id)
        }
        // While another connection holds the write lock the store cannot commit: no answer may come, and every call
        // returns at once (a delete that waited for its commit would hold this thread at the first).
        let release = try holdWriteLock()
        // Each answer with whether the store still held the job when the answer came.
        let answers = Watched<[(Result<DeleteOutcome, Error>, stillStored: Bool)]>([])
        for id in ids {
            engine.delete(id: id) { outcome in
                let stored = ((try? engine.store.job(id: id)) ?? nil) != nil
                answers.withLock { $0.append((outcome, stillStored: stored)) }
            }
        }
        XCTAssertEqual(answers.withLock { $0.count }, 0, "a delete was answered before the store could commit")
        for id in ids { XCTAssertNotNil(try engine.store.job(id: id)) }
        try release()
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 3 })
        for (answer, stillStored) in answers.withLock({ $0 }) {
            guard case .success(.deleted) = answer else { return XCTFail("delete answered \(answer)") }
            // A crash right after the answer must not bring the job back.
            XCTAssertFalse(stillStored, "a delete was answered before it was committed")
        }
        for id in ids {
            XCTAssertNil(try engine.job(id: id))
            guard case .notFound = try engine.delete(id: id) else { return XCTFail("job \(id) deleted twice") }
        }
    }

    func testCancelOfAFinishedButUnretiredJobWaitsForItsCommitToo() throws {
        let engine = try makeEngine()
        let job = try submit(engine, #"{"graph":{"type":"fetch","url":\#(u("/json"))}}"#)
        _ = try settled(engine, job.id)
        guard case .alreadySettled(let record) = try cancel(engine, job.id) else { return XCTFail("expected alreadySettled") }
        XCTAssertEqual(record.state, .succeeded)
        XCTAssertEqual(try engine.store.job(id: job.id)?.state, .succeeded)
        guard case .notFound = try cancel(engine, "no-such-job") else { return XCTFail("expected notFound") }
    }

    func testNoReadFindsADeletedJobOnceTheDeleteReturned() throws {
        let engine = try makeEngine()
        let violations = Box<[String]>([])
        let lock = NSLock()
        for round in 0..<20 {
            let job = try submit(engine, #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/json"))}]}}"#)
            _ = try settled(engine, job.id)
            let deleted = Box<Bool>(false)
            let started = DispatchSemaphore(value: 0)
            let group = DispatchGroup()
            for reader in 0..<4 {
                DispatchQueue.global().async(group: group) {
                    var reads = 0
                    var readsAfterDelete = 0
                    // Bounded: at most 200,000 reads; a reader stops by itself after 20 reads that began after
                    // the delete returned.
                    while reads < 200_000, readsAfterDelete < 20 {
                        reads += 1
                        let after = lock.withLock { deleted.value }
                        let found = (try? engine.job(id: job.id)) ?? nil
                        let nodes = (try? engine.nodes(jobID: job.id, includeResults: false)) ?? nil
                        if reads == 1 { started.signal() }
                        if after { readsAfterDelete += 1 }
                        if let nodes, nodes.isEmpty {
                            lock.withLock { violations.value.append("round \(round) reader \(reader): empty node list") }
                        }
                        if after, found != nil || nodes != nil {
                            lock.withLock { violations.value.append("round \(round) reader \(reader): found after delete") }
                            return
                        }
                    }
                }
            }
            // The delete races readers that are already reading.
            for _ in 0..<4 { XCTAssertEqual(started.wait(timeout: .now() + 10), .success, "a reader did not start") }
            guard case .deleted = try engine.delete(id: job.id) else { return XCTFail("delete did not delete") }
            lock.withLock { deleted.value = true }
            XCTAssertEqual(group.wait(timeout: .now() + 30), .success)
            XCTAssertNil(try engine.job(id: job.id))
            XCTAssertNil(try engine.nodes(jobID: job.id, includeResults: false))
        }
        XCTAssertEqual(Array(violations.value.prefix(5)), [], "\(violations.value.count) reads saw a deleted job")
    }

    func testRunningNodeShowsTheTimeSoFar() throws {
        let engine = try makeEngine()
        let job = try submit(engine, #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/hang"))}]}}"#)
        let running = try waitForNodes(engine, job.id) { $0["root.0"]?.state == .running }
        XCTAssertNotNil(running["root"]?.elapsedMs)
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(running["root.0"]?.elapsedMs), 0)
        XCTAssertNotNil(try engine.node(jobID: job.id, nodeID: "root.0")?.elapsedMs)
        _ = try cancel(engine, job.id)
        let done = try nodes(engine, job.id)
        XCTAssertNotNil(done["root.0"]?.elapsedMs)
    }

    // MARK: - Restart

    func testRestartResumesJobsKeepingSettledResults() throws {
        let first = try makeEngine(dbName: "resume.sqlite")
        let job = try submit(first, """
            {"graph":{"type":"sequence","children":[
              {"type":"fetch","url":\(u("/count/step1"))},
              {"type":"fetch","url":\(u("/delay/800"))},
              {"type":"fetch","url":\(u("/count/step3"))}]}}
            """)
        _ = try waitForNodes(first, job.id) { $0["root.0"]?.state == .succeeded && $0["root.1"]?.state != .pending }
        let startedBefore = try XCTUnwrap(try first.job(id: job.id)?.startedAt)
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let second = try makeEngine(dbName: "resume.sqlite")
        let done = try settled(second, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.result?.arrayValue?[0]["body"]?["count"], 1)
        let counters = try upstream.stats()["counters"]
        XCTAssertEqual(counters?["step1"], 1, "a settled node ran again")
        XCTAssertEqual(counters?["step3"], 1)
        XCTAssertEqual(done.startedAt, startedBefore, "the job's start moved on restart")
        let nodes = try nodes(second, job.id)
        XCTAssertLessThanOrEqual(try XCTUnwrap(nodes["root"]?.startedAt), try XCTUnwrap(nodes["root.0"]?.startedAt))
    }

    func testRestartFailsNonIdempotentFetchesThatWereInFlight() throws {
        let first = try makeEngine(dbName: "interrupt.sqlite")
        let job = try submit(first, #"{"graph":{"type":"fetch","method":"POST","url":\#(u("/delay/5000"))}}"#)
        _ = try waitForNodes(first, job.id) { $0["root"]?.state == .running }
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let second = try makeEngine(dbName: "interrupt.sqlite")
        let done = try settled(second, job.id)
        XCTAssertEqual(done.state, .failed)
        XCTAssertEqual(done.error?.kind, .interrupted)
    }

    // MARK: - Restart repair and isolation

    /// Writes a job straight into a store file, as a crash could have left it: `adjust` sets node states.
    func storeJob(
        _ store: JobStore, id: String, _ body: String, state: NodeState = .pending,
        adjust: (inout [NodeRecord]) -> Void = { _ in }
    ) throws {
        let request = try JSONValue.parse(body)
        let spec = try JobSpec.parse(request)
        var nodes = spec.graph.pendingNodeRecords(jobID: id)
        adjust(&nodes)
        var progress = Progress()
        for node in nodes {
            progress.total += 1
            progress[node.state] += 1
        }
        let job = JobRecord(
            id: id, state: state, createdAt: Timestamp.nowMs(), startedAt: state == .pending ? nil : Timestamp.nowMs(),
            finishedAt: state.isSettled ? Timestamp.nowMs() : nil, request: request, version: 3, progress: progress)
        guard case .created = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil) else {
            throw UpstreamError("job \(id) not created")
        }
    }

    func testARunningJobStoresANodeRowOnlyOnceTheNodeChangesAndARestartMakesTheOthersAgain() throws {
        // A sequence whose second child waits for the first: while the first hangs, the second's row is not stored
        // on SQLite, which writes a row with its node's first change or with its job once it settles. Servers that
        // share PostgreSQL read each other's rows, so there every row is written at once.
        let first = try makeEngine(dbName: "unchanged.sqlite")
        let job = try submit(first, """
            {"graph":{"type":"sequence","children":[
              {"id":"slow","type":"fetch","url":\(u("/hang"))},
              {"id":"next","type":"fetch","url":\(u("/json"))}]}}
            """)
        _ = try waitForNodes(first, job.id) { $0["slow"]?.state == .running }
        _ = try first.metricsNow
        try first.store.flush()
        XCTAssertEqual(
            try first.store.nodes(jobID: job.id, includeResults: false).map(\.id),
            Self.usesPostgres ? ["root", "slow", "next"] : ["root", "slow"])
        // Stopped as a kill would leave it: the rebuilt job makes the missing row again, pending, and runs on.
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        try executeRaw("UPDATE nodes SET state = 'succeeded', result = '1' WHERE id = 'slow'", dbName: "unchanged.sqlite")
        try executeRaw("UPDATE jobs SET p_running = p_running - 1, p_succeeded = p_succeeded + 1", dbName: "unchanged.sqlite")
        let restarted = try makeEngine(dbName: "unchanged.sqlite")
        XCTAssertEqual(try settled(restarted, job.id).state, .succeeded)
        XCTAssertEqual(try storedStates(restarted, job.id), [.succeeded, .succeeded, .succeeded])
        XCTAssertEqual(try restarted.metricsNow.jobLoadFailures, 0)
    }

    func testASettledJobHasEveryNodeRowStoredEvenThoseThatNeverChanged() throws {
        // The first child fails: the sequence stops, its second child never runs, and its row is stored all the same.
        let engine = try makeEngine()
        let job = try submit(engine, """
            {"graph":{"type":"sequence","children":[
              {"id":"bad","type":"fetch","url":\(u("/status/500"))},
              {"id":"never","type":"fetch","url":\(u("/json"))}]}}
            """)
        XCTAssertEqual(try settled(engine, job.id).state, .failed)
        XCTAssertEqual(try storedStates(engine, job.id).count, 3)
        let stored = try engine.store.nodes(jobID: job.id, includeResults: false)
        let shown = try nodes(engine, job.id)
        XCTAssertEqual(Dictionary(uniqueKeysWithValues: stored.map { ($0.id, $0.state) }), shown.mapValues(\.state))
    }

    func testRestartSettlesNodesLeftRunningInASettledJob() throws {
        let first = try makeEngine(dbName: "leftover.sqlite")
        let job = try submit(first, """
            {"graph":{"type":"list","fire_on_first_result":true,"cancel_remaining":false,"children":[
              {"id":"fast","type":"fetch","url":\(u("/json"))},
              {"id":"slow","type":"fetch","url":\(u("/hang"))}]}}
            """)
        _ = try waitForNodes(first, job.id) { $0["root"]?.state == .succeeded && $0["slow"]?.state == .running }
        // Let the job's settled state reach the disk, then stop without recording anything more, as a kill would.
        try first.store.flush()
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let raw = try makeStore(dbName: "leftover.sqlite")
        XCTAssertEqual(try raw.node(jobID: job.id, nodeID: "slow")?.state, .running, "the test needs a node left running")
        raw.close()

        let second = try makeEngine(dbName: "leftover.sqlite")
        let done = try XCTUnwrap(try second.job(id: job.id))
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.progress.running + done.progress.pending, 0)
        XCTAssertEqual(done.progress.percent, 100)
        let slow = try XCTUnwrap(try second.node(jobID: job.id, nodeID: "slow"))
        XCTAssertEqual(slow.state, .cancelled)
        XCTAssertEqual(slow.error?.kind, .cancelled)
        XCTAssertEqual(slow.error?.message, "the job had settled when the server stopped")
        XCTAssertNotNil(slow.finishedAt)
        XCTAssertNotNil(slow.elapsedMs)
    }

    func testRestartSettlesNodesLeftUnsettledUnderASettledParentOfAnUnfinishedJob() throws {
        let store = try makeStore(dbName: "orphans.sqlite")
        let body = #"{"graph":{"type":"list","fire_on_first_result":true,"cancel_remaining":false,"children":[{"type":"fetch","url":\#(u("/json"))},{"type":"fetch","url":\#(u("/hang"))}]}}"#
        try storeJob(store, id: "orphans", body, state: .running)
        var left = try store.nodes(jobID: "orphans", includeResults: true)
        let ok = try JSONValue.parse(#"{"ok":true}"#)
        left[0].state = .succeeded
        left[0].result = ok
        left[0].finishedAt = Timestamp.nowMs()
        left[1].state = .succeeded
        left[1].result = ok
        left[2].state = .running
        left[2].startedAt = Timestamp.nowMs()
        store.enqueue(jobs: [], nodes: left, bodies: [])
        try store.flush()
        store.close()

        let engine = try makeEngine(dbName: "orphans.sqlite")
        let done = try settled(engine, "orphans")
        XCTAssertEqual(done.state, .succeeded)
        let after = try nodes(engine, "orphans")
        XCTAssertEqual(after["root.1"]?.state, .cancelled)
        XCTAssertEqual(after["root.1"]?.error?.message, "its parent had settled when the server stopped")
        try engine.store.flush()
        let stored = try engine.store.nodes(jobID: "orphans", includeResults: false)
        XCTAssertEqual(stored.filter { !$0.state.isSettled }.count, 0)
        XCTAssertEqual(try upstream.stats()["requests"]?.intValue, 0, "a node under a settled parent ran again")
    }

    func testAStoredJobThatCannotBeLoadedFailsAloneAndTheOthersResume() throws {
        let store = try makeStore(dbName: "damaged.sqlite")
        let good = #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/json"))}]}}"#
        try storeJob(store, id: "a-good", good)
        try storeJob(store, id: "b-bad-request", good)
        try storeJob(store, id: "c-bad-metadata", good)
        try storeJob(store, id: "d-bad-node", good, state: .running)
        try storeJob(store, id: "e-good", good)
        store.close()
        // SQLite keeps a job's request in a table of its own (schema version 9).
        let (table, key) = Self.usesPostgres ? ("jobs", "id") : ("job_requests", "job_id")
        try executeRaw("UPDATE \(table) SET request = '{\"graph\": [' WHERE \(key) = 'b-bad-request'", dbName: "damaged.sqlite")
        try executeRaw("UPDATE jobs SET metadata = '{not json' WHERE id = 'c-bad-metadata'", dbName: "damaged.sqlite")
        try executeRaw("UPDATE nodes SET state = 'exploded' WHERE job_id = 'd-bad-node' AND position = 1", dbName: "damaged.sqlite")

        let engine = try makeEngine(dbName: "damaged.sqlite")
        for id in ["a-good", "e-good"] {
            XCTAssertEqual(try settled(engine, id).state, .succeeded, "job \(id)")
        }
        for id in ["b-bad-request", "c-bad-metadata", "d-bad-node"] {
            let job = try XCTUnwrap(try engine.job(id: id), "job \(id) unreadable")
            XCTAssertEqual(job.state, .failed, "job \(id)")
            XCTAssertEqual(job.error?.kind, .internal, "job \(id)")
            XCTAssertNotNil(job.finishedAt)
        }
        for id in ["b-bad-request", "c-bad-metadata"] {
            let nodes = try XCTUnwrap(try engine.nodes(jobID: id, includeResults: false))
            XCTAssertEqual(nodes.map(\.state), [.cancelled, .cancelled], "nodes of \(id)")
            let job = try XCTUnwrap(try engine.job(id: id))
            XCTAssertEqual(job.progress.cancelled, 2)
            XCTAssertEqual(job.progress.pending, 0)
        }
        XCTAssertEqual(try engine.metricsNow.jobLoadFailures, 3)
    }

    func testAJobsNodeRowsFollowItsCommitAndAreMadeAgainWhenACrashLostThem() throws {
        // A job that starts now is answered once its row is committed; its node rows follow in the next commit.
        let engine = try makeEngine()
        let hanging = #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/json"))},{"type":"fetch","url":\#(u("/hang"))}]}}"#
        let job = try submit(engine, hanging)
        _ = try waitForNodes(engine, job.id) { $0["root.0"]?.state == .succeeded && $0["root.1"]?.state == .running }
        XCTAssertEqual(try storedStates(engine, job.id), [.running, .succeeded, .running])
        XCTAssertEqual(try cancel(engine, job.id).isAlreadyCancelled, false)
        XCTAssertEqual(try engine.store.nodes(jobID: job.id, includeResults: false).map(\.state), [.cancelled, .succeeded, .cancelled])

        // What a crash between the two commits leaves: the job's row as created (version 1) without its nodes'. It
        // runs as if just submitted. A job changed since (version 3) whose rows are gone is damaged: it fails alone.
        let store = try makeStore(dbName: "rows.sqlite")
        let body = #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/json"))},{"type":"fetch","url":\#(u("/json"))}]}}"#
        try storeJob(store, id: "a-rows-lost", body)
        try storeJob(store, id: "b-rows-kept", body)
        try storeJob(store, id: "c-rows-lost-later", body)
        store.close()
        try executeRaw("DELETE FROM nodes WHERE job_id IN ('a-rows-lost', 'c-rows-lost-later')", dbName: "rows.sqlite")
        try executeRaw("UPDATE jobs SET version = 1 WHERE id = 'a-rows-lost'", dbName: "rows.sqlite")
        let restarted = try makeEngine(dbName: "rows.sqlite")
        for id in ["a-rows-lost", "b-rows-kept"] {
            XCTAssertEqual(try settled(restarted, id).state, .succeeded, "job \(id)")
            XCTAssertEqual(try storedStates(restarted, id), [.succeeded, .succeeded, .succeeded], "job \(id)")
        }
        let damaged = try XCTUnwrap(try restarted.job(id: "c-rows-lost-later"))
        XCTAssertEqual(damaged.state, .failed)
        XCTAssertEqual(damaged.error?.kind, .internal)
        XCTAssertEqual(try restarted.metricsNow.jobLoadFailures, 1)
    }

    // MARK: -

    func waitForDisconnect(path: String, seconds: Double = 10) throws -> Bool {
        do {
            try upstream.waitForStats("a disconnect from \(path)", seconds: seconds) { stats in
                let list = stats["disconnects"]?.arrayValue ?? []
                return list.contains(where: { $0["path"]?.stringValue?.hasPrefix(path) == true })
            }
            return true
        } catch is UpstreamError {
            return false
        }
    }
}

extension CancelOutcome {
    var isAlreadyCancelled: Bool {
        if case .alreadyCancelled = self { return true }
        return false
    }
}

