import Foundation
import HTTPServer
import TestSupport
import XCTest

@testable import JobCore
@testable import JobServer

/// Reads of jobs, nodes and `/metrics`: entity tags, the settled-job cache's byte bound, the counters `/metrics`
/// shows, and reads that never hold an event loop.
final class ReadPathTests: XCTestCase {
    private var upstream: Upstream!
    private var harness: AppHarness!
    private var dir: URL!

    override func setUpWithError() throws {
        upstream = try Upstream.start()
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("jobserver-read-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDown() {
        harness?.shutdown()
        upstream?.stop()
        if let dir { try? FileManager.default.removeItem(at: dir) }
        harness = nil
        upstream = nil
        dir = nil
    }

    /// Reads the settled job `id` until its answer is in the cache: a job leaves the engine's memory once its last
    /// state is committed, and only then is its answer made and kept (bounded).
    private func readUntilCached(_ id: String, file: StaticString = #filePath, line: UInt = #line) {
        for _ in 0..<500 where harness.engine.settledJobs[id] == nil {
            XCTAssertEqual(harness.call(.getJob, id: id).status, 200, file: file, line: line)
        }
        XCTAssertNotNil(harness.engine.settledJobs[id], "never cached", file: file, line: line)
    }

    /// Waits (bounded) until the settled job `id` has left the engine's memory, which it does once its last state is
    /// committed: from then on reads of it come from the store.
    private func waitUntilRetired(_ id: String, file: StaticString = #filePath, line: UInt = #line) {
        let engine = harness.engine
        for _ in 0..<100 {
            if engine.queue.sync(execute: { engine.runs[id] == nil }) { return }
            let committed = DispatchSemaphore(value: 0)
            engine.store.whenCommitted { _ in committed.signal() }
            XCTAssertEqual(committed.wait(timeout: .now() + 10), .success, file: file, line: line)
        }
        XCTFail("the settled job never left memory", file: file, line: line)
    }

    private func start(_ configure: (inout ServerConfig) -> Void = { _ in }) throws {
        let path = dir.appendingPathComponent("jobs.sqlite").path
        harness = try AppHarness {
            $0.dbPath = path
            configure(&$0)
        }
    }

    // MARK: Entity tags

    func testSettledJobHasAStrongETagAndIfNoneMatchGives304() throws {
        try start()
        let id = harness.submit(fetchJob(upstream.url("/json")))
        let job = try XCTUnwrap(harness.settled(id))
        let version = try XCTUnwrap(job["version"]?.intValue)
        let tag = "\"\(id)-\(version)\""

        readUntilCached(id)
        let first = harness.call(.getJob, id: id)
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(first.headers["ETag"], tag)
        XCTAssertEqual(first.json?["state"], "succeeded")
        let again = harness.call(.getJob, id: id)
        XCTAssertEqual(again.body, first.body, "a settled job's answer is the same bytes every time")
        XCTAssertEqual(harness.engine.settledJobs[id]?.body, first.body)

        for header in [tag, "W/\(tag)", "\"other\", \(tag)", "*"] {
            let notModified = harness.call(.getJob, id: id, headers: [("If-None-Match", header)])
            XCTAssertEqual(notModified.status, 304, header)
            XCTAssertEqual(notModified.headers["ETag"], tag, header)
            XCTAssertTrue(notModified.body.isEmpty, header)
        }
        let other = harness.call(.getJob, id: id, headers: [("If-None-Match", "\"\(id)-\(version - 1)\"")])
        XCTAssertEqual(other.status, 200)
        XCTAssertEqual(other.body, first.body)
        let waited = harness.call(.getJob, id: id, query: [("wait", "5")], headers: [("If-None-Match", tag)])
        XCTAssertEqual(waited.status, 304, "a long-poll answering the same version is not modified either")
    }

    func testConditionalReadOfAStoredJobAtItsVersionIs304WithoutReadingTheJob() throws {
        try start()
        let id = harness.submit(fetchJob(upstream.url("/json")))
        let job = try XCTUnwrap(harness.settled(id))
        let tag = "\"\(id)-\(try XCTUnwrap(job["version"]?.intValue))\""

        // Once the job has left the engine's memory, reads come from the store, where a whole read would make the
        // answer and keep it (a settled job's answer is made once). The long-poll that saw it settle kept it
        // already: dropped here, so that only such a read puts it back.
        waitUntilRetired(id)
        let engine = harness.engine
        engine.settledJobs.removeAll()
        for header in [tag, "W/\(tag)", "*"] {
            let notModified = harness.call(.getJob, id: id, headers: [("If-None-Match", header)])
            XCTAssertEqual(notModified.status, 304, header)
            XCTAssertEqual(notModified.headers["ETag"], tag, header)
            XCTAssertTrue(notModified.body.isEmpty, header)
            XCTAssertNil(engine.settledJobs[id], "the job was read and shown for a 304 (\(header))")
        }

        let stale = harness.call(.getJob, id: id, headers: [("If-None-Match", "\"\(id)-1\"")])
        XCTAssertEqual(stale.status, 200, "another version's tag is answered in full")
        XCTAssertEqual(stale.headers["ETag"], tag)
        XCTAssertEqual(stale.json?["state"], "succeeded")
        XCTAssertNotNil(engine.settledJobs[id], "a whole read from the store makes the answer once and keeps it")
        let missing = harness.call(.getJob, id: "01NOSUCHJOB", headers: [("If-None-Match", "*")])
        XCTAssertEqual(missing.status, 404)
    }

    func testRunningJobsETagFollowsItsVersion() throws {
        try start()
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        // The version grows as the fetch starts: wait until a long-poll sees it stay, running.
        var version = 0
        for _ in 0..<20 {
            let seen = harness.call(.getJob, id: id, query: [("wait", "1"), ("since", String(version))])
            let now = seen.json?["version"]?.intValue ?? 0
            if now == version, seen.json?["state"] == "running" { break }
            version = now
        }
        let tag = "\"\(id)-\(version)\""
        let now = harness.call(.getJob, id: id)
        XCTAssertEqual(now.headers["ETag"], tag)
        XCTAssertEqual(harness.call(.getJob, id: id, headers: [("If-None-Match", tag)]).status, 304)
        XCTAssertNil(harness.engine.settledJobs[id], "a running job's answer is not kept")

        XCTAssertEqual(harness.call(.cancelJob, id: id).status, 202)
        let cancelled = try XCTUnwrap(harness.settled(id))
        let after = harness.call(.getJob, id: id, headers: [("If-None-Match", tag)])
        XCTAssertEqual(after.status, 200, "the version moved on: the old tag no longer matches")
        XCTAssertEqual(after.headers["ETag"], "\"\(id)-\(cancelled["version"]?.intValue ?? -1)\"")
        XCTAssertEqual(after.json?["state"], "cancelled")
    }

    func testUnknownJobIs404WithoutAnETag() throws {
        try start()
        let missing = harness.call(.getJob, id: "nope", headers: [("If-None-Match", "*")])
        XCTAssertEqual(missing.status, 404)
        XCTAssertNil(missing.headers["ETag"])
    }

    /// A job read from the store has its result written from its nodes' rows into the answer: byte for byte what its
    /// result read as values makes (every entry kind, a nested list, a first result, members after the result).
    func testAStoredJobsAnswerWrittenFromItsRowsIsTheAnswerItsResultAsValuesMakes() throws {
        // Entries up to 1 KiB are kept; this job's answer is larger, so it is made from the store once retired.
        try start { $0.settledCacheBytes = 8 << 10 }
        let id = submitMixedJobAndRetire()
        let engine = harness.engine
        // The long-poll's answer is let go of once its read is through: the read below makes it from the store.
        for queue in engine.readQueues { queue.sync {} }
        XCTAssertNil(engine.settledJobs[id])
        let stored = try XCTUnwrap(try engine.store.jobWithoutRequest(id: id))
        XCTAssertEqual(stored.resultSource, .child(0), "the job's row refers to its root's result")
        let answer = harness.call(.getJob, id: id)
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.text, String(decoding: Presentation.jobBytes(stored), as: UTF8.self))
    }

    /// A job's nodes with their results read from the store are written from the rows: byte for byte what the
    /// results read as values make (each fetch's result shown by the lists above it again, copied).
    func testAStoredJobsNodeListWrittenFromItsRowsIsTheListItsResultsAsValuesMake() throws {
        try start()
        let id = submitMixedJobAndRetire()
        let engine = harness.engine
        let stored = try engine.store.nodes(jobID: id, includeResults: true)
        XCTAssertGreaterThan(stored.count, 1)
        let answer = harness.call(.listNodes, id: id, query: [("include", "result")])
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.text, String(decoding: Presentation.nodeListBytes(stored.inTreeOrder()), as: UTF8.self))
    }

    /// Past its size bound, a stored job's answer, and its nodes with their results, are written to a temporary file
    /// beside the store and sent from it: over a real connection, byte for byte what the results as values make,
    /// `HEAD` with the length, `304` to a reader that has it; readers meanwhile share the one file, and no file is
    /// left in the store's folder.
    func testLargeStoredAnswersAreSentFromTemporaryFilesByteForByte() throws {
        try start { $0.spoolAnswerBytes = 1 }
        let id = submitMixedJobAndRetire()
        let stored = try harness.engine.store.nodes(jobID: id, includeResults: true)
        let storedJob = try XCTUnwrap(try harness.engine.store.jobWithoutRequest(id: id))

        var configuration = harness.app.makeServerConfiguration()
        configuration.port = 0
        let server = HTTPServer(configuration: configuration, router: harness.app.makeRouter())
        let port = try server.start()
        defer { _ = server.shutdown(gracePeriodSeconds: 2) }
        let reads = [
            ("/v1/jobs/\(id)/nodes?include=result", Presentation.nodeListBytes(stored.inTreeOrder())),
            ("/v1/jobs/\(id)", Presentation.jobBytes(storedJob)),
        ]
        for (target, expected) in reads {
            let answer = try RawHTTPClient.send(port: port, "GET", target)
            XCTAssertEqual(answer.status, 200, target)
            XCTAssertEqual(answer.header("Content-Type"), "application/json", target)
            XCTAssertEqual(answer.text, String(decoding: expected, as: UTF8.self), target)
            let head = try RawHTTPClient.send(port: port, "HEAD", target)
            XCTAssertEqual(head.header("Content-Length"), String(expected.count), target)
            XCTAssertEqual(head.body, [], target)
        }
        let tag = try XCTUnwrap(try RawHTTPClient.send(port: port, "GET", "/v1/jobs/\(id)").header("ETag"))
        let unchanged = try RawHTTPClient.send(port: port, "GET", "/v1/jobs/\(id)", headers: [("If-None-Match", tag)])
        XCTAssertEqual(unchanged.status, 304)
        XCTAssertEqual(unchanged.body, [])

        // Held by a reader, the answer is in a file; a second reader meanwhile is given the same one.
        let engine = harness.engine
        func shown() throws -> SettledAnswer? {
            let found = try engine.answer("nodes of \(id)") { engine.nodeList(jobID: id, includeResults: true, $0) }.get()
            guard case .shown(let answer) = found else { return nil }
            return answer
        }
        let held = try XCTUnwrap(try shown())
        let file = try XCTUnwrap(held.file, "the answer is not in a file")
        XCTAssertEqual(try file.bytes(), reads[0].1)
        XCTAssertEqual(held.bytes, [], "the answer is held in memory too")
        XCTAssertTrue(try shown() === held, "a reader meanwhile gets the same file")
        let folder = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        XCTAssertEqual(folder.filter { !$0.hasPrefix("jobs.sqlite") }, [], "a file left beside the store")
    }

    /// A long-poll's answer written in runs at once (`EntryRuns`: no texts, as with the settled-job cache off, and a
    /// list of at least `answerRunsMinimumEntries` entries) goes out in the runs' arrays, the same bytes as the job's
    /// answer from the store, under a `Content-Length` that counts them all.
    func testALongPollsAnswerWrittenInRunsIsSentWhole() throws {
        guard CoreRuns.count >= 2 else { throw XCTSkip("one core: every answer is written on one thread") }
        try start {
            $0.settledCacheBytes = 0
            $0.answerRunsMinimumEntries = 3
        }
        var configuration = harness.app.makeServerConfiguration()
        configuration.port = 0
        let server = HTTPServer(configuration: configuration, router: harness.app.makeRouter())
        let port = try server.start()
        defer { _ = server.shutdown(gracePeriodSeconds: 2) }
        let fetches = (1...7).map { #"{"type":"fetch","url":"\#(upstream.url("/json?size=\($0 * 300)"))"}"# }
        let id = harness.submit(#"{"graph":{"type":"list","children":[\#(fetches.joined(separator: ","))]}}"#)
        let answer = try RawHTTPClient.send(port: port, "GET", "/v1/jobs/\(id)?wait=30")
        XCTAssertEqual(answer.status, 200)
        waitUntilRetired(id)
        let stored = try XCTUnwrap(try harness.engine.store.jobWithoutRequest(id: id))
        XCTAssertEqual(stored.state, .succeeded)
        XCTAssertEqual(answer.text, String(decoding: Presentation.jobBytes(stored), as: UTF8.self))
        XCTAssertEqual(answer.header("Content-Length"), String(answer.body.count))
    }

    /// Submits a job with every kind of entry (JSON, text and bytes bodies, a failed fetch, a `consume_errors` list,
    /// a `fire_on_first_result` list, `name` and `metadata`), waits until it succeeded and left memory.
    private func submitMixedJobAndRetire() -> String {
        func fetch(_ path: String) -> String { #"{"type":"fetch","url":"\#(upstream.url(path))"}"# }
        let body = """
            {"name":"mixed","metadata":{"team":"a"},"graph":{"type":"list","children":[
              \(fetch("/json")), \(fetch("/text")), \(fetch("/bytes/10")), \(fetch("/status/404")),
              {"type":"list","consume_errors":true,"children":[\(fetch("/status/404")), \(fetch("/json?size=50"))]},
              {"type":"list","fire_on_first_result":true,"children":[\(fetch("/json?size=60"))]}]}}
            """
        let id = harness.submit(body)
        XCTAssertEqual(harness.settled(id)?["state"], "succeeded")
        waitUntilRetired(id)
        return id
    }

    // MARK: The settled-job cache

    func testSettledCacheStaysWithinItsByteBound() throws {
        let bound = 24 * 1024
        try start { $0.settledCacheBytes = bound }
        // Each answer is over 1 KiB (a 1 KiB result), so the bound holds far fewer than the jobs read.
        var ids: [String] = []
        for _ in 0..<40 { ids.append(harness.submit(fetchJob(upstream.url("/json?size=1024")))) }
        for id in ids { XCTAssertNotNil(harness.settled(id)) }
        let cache = harness.engine.settledJobs
        var largest = 0
        for id in ids {
            readUntilCached(id)
            let answer = harness.call(.getJob, id: id)
            XCTAssertEqual(answer.status, 200)
            largest = max(largest, answer.body.count)
            XCTAssertLessThanOrEqual(cache.bytes, bound)
        }
        XCTAssertGreaterThan(largest, 1024)
        XCTAssertGreaterThan(cache.count, 0)
        XCTAssertLessThan(cache.count, ids.count, "the bound evicted some")
        XCTAssertNotNil(cache[ids[ids.count - 1]], "the latest read stays")
        XCTAssertNil(cache[ids[0]], "the oldest went first")
        // Answers evicted from the cache are made again, the same.
        XCTAssertEqual(harness.call(.getJob, id: ids[0]).json?["id"]?.stringValue, ids[0])
    }

    func testReadersOfAnAnswerTooLargeToKeepShareOneCopyWhileOneHoldsIt() throws {
        // Entries up to 1 KiB are kept; this job's answer is larger.
        try start { $0.settledCacheBytes = 8 << 10 }
        let id = harness.submit(fetchJob(upstream.url("/json?size=4000")))
        XCTAssertNotNil(harness.settled(id))
        let engine = harness.engine
        func read() throws -> SettledJob? {
            let found = try engine.answer("read of \(id)") { engine.readJob(id: id, $0) }.get()
            guard case .settled(let settled) = found else { return nil }
            return settled
        }
        waitUntilRetired(id)
        // The long-poll's answer was not kept: nothing holds it once that read is through.
        for queue in engine.readQueues { queue.sync {} }
        XCTAssertNil(engine.settledJobs[id])
        var held = try XCTUnwrap(try read(), "made from the store")
        XCTAssertGreaterThan(held.body.count, 1 << 10)
        XCTAssertEqual(engine.settledJobs.bytes, 0, "too large to keep")

        let second = try XCTUnwrap(try read())
        XCTAssertTrue(second.answer === held.answer, "a reader meanwhile gets the same copy")
        let http = harness.call(.getJob, id: id)
        XCTAssertEqual(http.status, 200)
        XCTAssertEqual(http.body, held.body)

        weak let watched = held.answer
        held = SettledJob(id: "", version: 0, body: [])
        _ = consume second
        // The reads' completions ran on the read queues: once these are through, they hold nothing.
        for queue in engine.readQueues { queue.sync {} }
        XCTAssertNil(watched, "nothing keeps the answer once its readers let go")
        XCTAssertNil(engine.settledJobs[id])
        let again = try XCTUnwrap(try read(), "made again from the store")
        XCTAssertEqual(again.body, http.body)
    }

    func testNodesWithResultsOfAStoredJobAreShownOnceAndSharedWhileAReaderHoldsThem() throws {
        try start()
        let url = upstream.url("/json?size=2000")
        let id = harness.submit(
            #"{"graph":{"type":"list","children":[{"id":"a","type":"fetch","url":"\#(url)"},"#
                + #"{"type":"sequence","children":[{"id":"b","type":"fetch","url":"\#(url)"}]}]}}"#)
        XCTAssertNotNil(harness.settled(id))
        waitUntilRetired(id)
        let engine = harness.engine
        let records = try XCTUnwrap(
            try engine.answer("nodes of \(id)") { engine.nodes(jobID: id, includeResults: true, $0) }.get())
        let expected = Presentation.nodeList(records, includeResult: true).bytes

        let first = harness.call(.listNodes, id: id, query: [("include", "result")])
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(first.headers["Content-Type"], "application/json")
        XCTAssertEqual(first.body, expected, "the nodes as a read of them from the store shows them")
        let light = harness.call(.listNodes, id: id)
        XCTAssertEqual(light.body, Presentation.nodeList(records, includeResult: false).bytes)

        func shown() throws -> SettledAnswer? {
            let found = try engine.answer("nodes of \(id)") { engine.nodeList(jobID: id, includeResults: true, $0) }.get()
            guard case .shown(let answer) = found else { return nil }
            return answer
        }
        var held = try XCTUnwrap(try shown())
        XCTAssertEqual(held.bytes, expected)
        XCTAssertTrue(try shown() === held, "a reader meanwhile gets the same copy")
        weak let watched = held
        held = SettledAnswer([])
        for queue in engine.readQueues { queue.sync {} }
        XCTAssertNil(watched, "nothing keeps the list once its readers let go")
        XCTAssertNil(engine.settledJobs.nodeList(of: id))
        XCTAssertEqual(try XCTUnwrap(try shown()).bytes, expected, "shown again from the store")
    }

    func testSettledCacheBoundCountsBytesNotEntries() {
        let cache = SettledJobCache(capacityBytes: 100_000)
        var inserted = 0
        for k in 0..<5_000 {
            let body = [UInt8](repeating: UInt8(ascii: "x"), count: 100 + (k % 7) * 300)
            cache.insert(SettledJob(id: "job-\(k)", version: 1, body: body), ifNoRemovalSince: cache.removals)
            inserted += 1
            XCTAssertLessThanOrEqual(cache.bytes, 100_000)
        }
        XCTAssertGreaterThan(cache.bytes, 100_000 - 2_000 - SettledJobCache.overheadBytes, "full up to one entry")
        XCTAssertNotNil(cache["job-4999"])
        XCTAssertNil(cache["job-0"])
        // Larger than an eighth of the bound: answered, never kept.
        cache.insert(SettledJob(id: "big", version: 1, body: [UInt8](repeating: 0, count: 20_000)), ifNoRemovalSince: cache.removals)
        XCTAssertNil(cache["big"])
        // Read before a removal (perhaps of this very job): not kept, so a delete is never undone.
        let before = cache.removals
        cache.remove("job-4999")
        XCTAssertNil(cache["job-4999"])
        cache.insert(SettledJob(id: "job-4999", version: 1, body: [1]), ifNoRemovalSince: before)
        XCTAssertNil(cache["job-4999"])
        cache.removeAll()
        XCTAssertEqual(cache.bytes, 0)
        XCTAssertEqual(cache.count, 0)
    }

    func testDeletedJobIsNotServedFromTheCache() throws {
        try start()
        let id = harness.submit(fetchJob(upstream.url("/json")))
        XCTAssertNotNil(harness.settled(id))
        readUntilCached(id)
        XCTAssertEqual(harness.call(.deleteJob, id: id).status, 204)
        XCTAssertNil(harness.engine.settledJobs[id])
        XCTAssertEqual(harness.call(.getJob, id: id).status, 404)
    }

    // MARK: Counters

    /// `jobserver_jobs{state=…}` and `jobserver_nodes{state=…}` as `/metrics` shows them.
    private func gauges(_ family: String) -> [String: Int] {
        let text = harness.call(.metrics).text
        var out: [String: Int] = [:]
        for line in text.split(separator: "\n") where line.hasPrefix("\(family){state=\"") {
            let rest = line.dropFirst("\(family){state=\"".count)
            guard let quote = rest.firstIndex(of: "\""), let space = rest.lastIndex(of: " "),
                let value = Int(rest[rest.index(after: space)...])
            else { continue }
            out[String(rest[..<quote])] = value
        }
        return out
    }

    private func storeCounts() throws -> [String: Int] {
        try harness.engine.store.flush()
        var out: [String: Int] = [:]
        for (state, count) in try harness.engine.store.jobCounts() { out[state.rawValue] = count }
        return out
    }

    /// The store's counts, once `/metrics` shows the same: the job `id` may still be moving (a resumed fetch starts
    /// again), so each look that differs waits for its next version (bounded).
    private func countsAgree(following id: String, file: StaticString = #filePath, line: UInt = #line) throws -> [String: Int] {
        for _ in 0..<20 {
            let version = harness.call(.getJob, id: id).json?["version"]?.intValue ?? 0
            let counts = try storeCounts()
            if gauges("jobserver_jobs") == counts { return counts }
            _ = harness.call(.getJob, id: id, query: [("wait", "1"), ("since", String(version))])
        }
        let counts = try storeCounts()
        XCTAssertEqual(gauges("jobserver_jobs"), counts, file: file, line: line)
        return counts
    }

    func testMetricsCountersEqualTheStoreAfterAMixOfJobsAndARestart() throws {
        try start()
        var settled: [String] = []
        for path in ["/json", "/json", "/status/500", "/text", "/status/404"] {
            settled.append(harness.submit(fetchJob(upstream.url(path))))
        }
        let list = harness.submit(
            #"{"graph":{"type":"list","children":[{"type":"fetch","url":"\#(upstream.url("/json"))"},{"type":"fetch","url":"\#(upstream.url("/status/503"))"}]}}"#)
        settled.append(list)
        let cancelled = harness.submit(fetchJob(upstream.url("/hang")))
        let hanging = harness.submit(fetchJob(upstream.url("/hang")))
        for id in settled { XCTAssertNotNil(harness.settled(id)) }
        XCTAssertEqual(harness.call(.cancelJob, id: cancelled).status, 202)
        XCTAssertEqual(harness.settled(cancelled)?["state"], "cancelled")
        XCTAssertEqual(harness.call(.deleteJob, id: settled[0]).status, 204)

        let counts = try countsAgree(following: hanging)
        XCTAssertEqual(counts["succeeded"], 3)
        XCTAssertEqual(counts["failed"], 2)
        XCTAssertEqual(counts["cancelled"], 1)
        XCTAssertEqual((counts["pending"] ?? 0) + (counts["running"] ?? 0), 1)
        let nodes = gauges("jobserver_nodes")
        XCTAssertEqual((nodes["pending"] ?? 0) + (nodes["running"] ?? 0), 1, "the hanging job's one node")

        // A restart counts from the store once, then moves on from there.
        harness.shutdown()
        try start()
        _ = try countsAgree(following: hanging)
        XCTAssertEqual(harness.call(.cancelJob, id: hanging).status, 202)
        XCTAssertEqual(harness.settled(hanging)?["state"], "cancelled")
        XCTAssertEqual(harness.call(.deleteJob, id: list).status, 204)
        let after = try countsAgree(following: hanging)
        XCTAssertEqual(after["cancelled"], 2)
        XCTAssertEqual(after["succeeded"], 2)
    }

    // MARK: Event loops

    func testReadsWaitingForTheEngineOrTheStoreDoNotStallHealthzOnTheSameEventLoop() throws {
        try start()
        // A settled job of 20 results of 100 KB: a 2 MB answer, read from the store once the job has retired.
        let children = (0..<20).map { _ in #"{"type":"fetch","url":"\#(upstream.url("/json?size=100000"))"}"# }
        let id = harness.submit(#"{"graph":{"type":"list","children":[\#(children.joined(separator: ","))]}}"#)
        XCTAssertNotNil(harness.settled(id))

        var configuration = harness.app.makeServerConfiguration()
        configuration.port = 0
        configuration.eventLoopCount = 1
        let server = HTTPServer(configuration: configuration, router: harness.app.makeRouter())
        let port = try server.start()
        defer { _ = server.shutdown(gracePeriodSeconds: 2) }

        // While the engine's queue is held, and then while every read queue is, the nodes answer cannot be made;
        // the one event loop must answer /healthz meanwhile.
        let engine = harness.engine
        let holds: [(String, [DispatchQueue])] = [("engine queue", [engine.queue]), ("read queues", engine.readQueues)]
        for (what, queues) in holds {
            let gate = DispatchSemaphore(value: 0)
            let held = DispatchGroup()
            for queue in queues {
                held.enter()
                queue.async {
                    held.leave()
                    gate.wait()
                }
            }
            var released = false
            defer { if !released { for _ in queues { gate.signal() } } }
            XCTAssertEqual(held.wait(timeout: .now() + 10), .success, what)
            // The nodes request is sent before /healthz, on its own connection, and read only afterwards.
            let fd = try RawHTTPClient.connect(port: port)
            defer { close(fd) }
            try writeAll(fd, "GET /v1/jobs/\(id)/nodes?include=result HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            let health = try RawHTTPClient.send(port: port, "GET", "/healthz", timeoutSeconds: 10)
            XCTAssertEqual(health.status, 200, what)
            var pending = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            XCTAssertEqual(poll(&pending, 1, 0), 0, "the nodes answer cannot be ready while the \(what) are held")
            for _ in queues { gate.signal() }
            released = true
            let answer = try readToEnd(fd)
            XCTAssertEqual(answer.status, 200, what)
            XCTAssertGreaterThan(answer.body.count, 2_000_000, what)
            XCTAssertEqual(answer.json?["nodes"]?.arrayValue?.count, 21, what)
        }
    }
}

private func writeAll(_ fd: Int32, _ text: String) throws {
    let bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { throw RawHTTPClientError.closedEarly("write") }
        offset += n
    }
}

/// A `Connection: close` response: everything until the server closes (at most 30 s of silence).
private func readToEnd(_ fd: Int32) throws -> WireResponse {
    var timeout = timeval(tv_sec: 30, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var received: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = read(fd, &chunk, chunk.count)
        if n <= 0 { break }
        received.append(contentsOf: chunk[0..<n])
    }
    let marker: [UInt8] = [13, 10, 13, 10]
    guard let end = (0..<max(0, received.count - 3)).first(where: { received[$0..<($0 + 4)].elementsEqual(marker) }),
        let statusLine = String(decoding: received[0..<end], as: UTF8.self).split(separator: "\r\n").first,
        let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "")
    else { throw RawHTTPClientError.closedEarly(String(decoding: received.prefix(200), as: UTF8.self)) }
    return WireResponse(status: status, headers: [], body: Array(received[(end + 4)...]))
}
