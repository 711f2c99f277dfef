import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// Paginated fetches (API.md §7.2) run by the engine against the upstream fixture's paged collections.
class PaginateEngineTests: EngineTestCase {
    private func submit(_ engine: Engine, _ graph: String) throws -> JobRecord {
        let json = try JSONValue.parse(#"{"graph": \#(graph)}"#)
        switch try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) {
        case .created(let job): return job
        case let other: throw UpstreamError("submit answered \(other)")
        }
    }

    /// Waits (at most 10 s) until `condition` holds for the root node, looking at each change of the job.
    private func waitForRoot(_ engine: Engine, _ id: String, _ condition: (NodeRecord) -> Bool) throws -> NodeRecord {
        var root: NodeRecord?
        _ = try untilJob(engine, id) {
            root = try engine.nodes(jobID: id, includeResults: false)?.first.flatMap { condition($0) ? $0 : nil }
            return root != nil
        }
        if let root { return root }
        throw UpstreamError("the root of \(id) never reached the awaited condition")
    }

    private func counter(_ name: String) throws -> Int {
        try upstream.stats()["counters"]?[name]?.intValue ?? 0
    }

    private func ids(_ range: ClosedRange<Int>) -> JSONValue {
        .array(range.map { .object([JSONMember("id", .int($0))]) })
    }

    private func page(_ path: String, _ paginate: String, extra: String = "") -> String {
        #"{"id": "walk", "type": "fetch", "url": "\#(upstream.url(path))", \#(extra)"paginate": \#(paginate)}"#
    }

    func testLinkWalkGathersItemsAndShowsPagesAndAttempts() throws {
        let engine = try makeEngine()
        let job = try submit(engine, page("/pages/link?n=3&per=2&key=a", #"{"next": "link", "items": "/body"}"#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.result?["items"], ids(1...6))
        XCTAssertEqual(done.result?["pages"], 3)
        XCTAssertEqual(done.result?["truncated"], false)
        XCTAssertEqual(done.result?["last"]?["url"]?.stringValue, upstream.url("/pages/link?page=3&key=a&n=3&per=2"))
        let node = try XCTUnwrap(try engine.node(jobID: job.id, nodeID: "walk"))
        XCTAssertEqual(node.pages, 3)
        XCTAssertEqual(node.attempts, 3)
        XCTAssertEqual(node.status, 200)
        for k in 1...3 { XCTAssertEqual(try counter("a:\(k)"), 1) }
    }

    func testUrlCursorAndPageWalks() throws {
        let engine = try makeEngine()
        let url = try submit(engine, page("/pages/url?n=2&per=2", #"{"next": {"url": "/body/next"}, "items": "/body/items"}"#))
        let cursor = try submit(
            engine, page("/pages/cursor?n=3&per=1", #"{"next": {"cursor": "/body/next_cursor"}, "items": "/body/data/items"}"#))
        let number = try submit(
            engine, page("/pages/number?n=2&per=3", #"{"next": {"page": "page", "start": 1}, "items": "/body/items"}"#))
        XCTAssertEqual(try settled(engine, url.id).result?["items"], ids(1...4))
        XCTAssertEqual(try settled(engine, cursor.id).result?["items"], ids(1...3))
        let numbered = try settled(engine, number.id)
        XCTAssertEqual(numbered.result?["items"], ids(1...6))
        XCTAssertEqual(numbered.result?["pages"], 3, "the empty page that ends the walk counts")
    }

    func testWithoutItemsEachPageResultIsKept() throws {
        let engine = try makeEngine()
        let job = try submit(engine, page("/pages/link?n=2&per=1", #"{"next": "link"}"#, extra: #""select": "/results", "#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.result?.arrayValue?.map { $0["body"] }, [ids(1...1), ids(2...2)])
    }

    func testMaxPagesTruncatesWithoutFailing() throws {
        let engine = try makeEngine()
        let job = try submit(engine, page("/pages/link?n=4&per=1&key=t", #"{"next": "link", "items": "/body", "max_pages": 3}"#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.result?["truncated"], true)
        XCTAssertEqual(done.result?["items"], ids(1...3))
        XCTAssertEqual(try counter("t:4"), 0)
        // Stopping at max_pages on the last page is no truncation.
        let exact = try submit(engine, page("/pages/link?n=3&per=1", #"{"next": "link", "items": "/body", "max_pages": 3}"#))
        XCTAssertEqual(try settled(engine, exact.id).result?["truncated"], false)
    }

    func testCrossOriginNextFailsUnlessAllowed() throws {
        let engine = try makeEngine()
        let refused = try submit(engine, page("/pages/cross?n=2&per=1&key=x", #"{"next": "link", "items": "/body"}"#))
        let failed = try settled(engine, refused.id)
        XCTAssertEqual(failed.state, .failed)
        XCTAssertEqual(failed.error?.kind, .crossOrigin)
        XCTAssertEqual(failed.error?.node, "walk")
        XCTAssertEqual(try counter("x:2"), 0, "the other origin is never asked")
        let allowed = try submit(
            engine, page("/pages/cross?n=2&per=1", #"{"next": "link", "items": "/body", "same_origin": false}"#))
        XCTAssertEqual(try settled(engine, allowed.id).result?["items"], ids(1...2))
    }

    func testItemsThatAreNotAnArrayFailWithRefType() throws {
        let engine = try makeEngine()
        let job = try submit(engine, page("/pages/url?n=2", #"{"next": {"url": "/body/next"}, "items": "/body/next"}"#))
        XCTAssertEqual(try settled(engine, job.id).error?.kind, .refType)
        let missing = try submit(engine, page("/pages/url?n=2", #"{"next": {"url": "/body/next"}, "items": "/body/nope"}"#))
        XCTAssertEqual(try settled(engine, missing.id).error?.kind, .refUnresolved)
    }

    func testHeadFollowsTheLinkHeader() throws {
        let engine = try makeEngine()
        let job = try submit(
            engine, page("/pages/link?n=3&per=1&key=h", #"{"next": "link"}"#, extra: #""method": "HEAD", "#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.result?["pages"], 3)
        XCTAssertEqual(done.result?["results"]?.arrayValue?.map { $0["body"] }, [.string(""), .string(""), .string("")])
        XCTAssertEqual(try counter("h:3"), 1)
    }

    func testANextURLThatIsNotHttpFailsWithInvalidURL() throws {
        let engine = try makeEngine()
        // /echo answers its query in the body: the next URL read from there is ftp://….
        let job = try submit(engine, page("/echo?ftp://127.0.0.1/x", #"{"next": {"url": "/body/query"}}"#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.error?.kind, .invalidURL)
        XCTAssertTrue(done.error?.message.contains("scheme must be http or https") == true, "\(String(describing: done.error))")
        XCTAssertEqual(try engine.node(jobID: job.id, nodeID: "walk")?.pages, 1)
    }

    func testEachPageIsRetriedAndCountsInAttempts() throws {
        let engine = try makeEngine()
        let job = try submit(
            engine,
            page("/pages/link?n=3&per=1&fail=3&key=r", #"{"next": "link", "items": "/body"}"#,
                 extra: #""retries": 1, "retry_backoff_ms": 1, "#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.result?["items"], ids(1...3))
        XCTAssertEqual(try engine.node(jobID: job.id, nodeID: "walk")?.attempts, 4)
        XCTAssertEqual(try counter("r:3"), 2)
    }

    func testMaxBytesBoundsTheSumOfPages() throws {
        let engine = try makeEngine()
        // A page of one item is 10 bytes ([{"id":1}]): two fit in 25, three do not.
        let job = try submit(
            engine, page("/pages/link?n=3&per=1", #"{"next": "link", "items": "/body"}"#, extra: #""max_bytes": 25, "#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.error?.kind, .tooLarge)
        XCTAssertTrue(done.error?.message.contains("page 3 takes the pages over 25 bytes together") == true,
                      done.error?.message ?? "")
        let fits = try submit(
            engine, page("/pages/link?n=3&per=1", #"{"next": "link", "items": "/body"}"#, extra: #""max_bytes": 30, "#))
        XCTAssertEqual(try settled(engine, fits.id).result?["pages"], 3)
    }

    /// A later page that crosses the job's budget (`--max-job-bytes`) fails with the budget's words, which name
    /// the flag to raise, not with those of the fetch's own `max_bytes`.
    func testAPageThatCrossesTheJobsBudgetSaysSo() throws {
        let engine = try makeEngine { $0.maxJobBytes = 25 }
        let job = try submit(engine, page("/pages/link?n=3&per=1", #"{"next": "link", "items": "/body"}"#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.error?.kind, .tooLarge)
        let message = done.error?.message ?? ""
        XCTAssertTrue(message.contains("--max-job-bytes") && !message.contains("takes the pages over"), message)
    }

    func testPagesShowWhileRunningAndCancelAbortsThePageInFlight() throws {
        let engine = try makeEngine()
        let job = try submit(
            engine, page("/pages/link?n=3&per=1&slow=2&slow_ms=20000&key=c", #"{"next": "link", "items": "/body"}"#))
        let running = try waitForRoot(engine, job.id) { $0.pages == 1 }
        XCTAssertEqual(running.state, .running)
        // Page 2 must be in flight at the upstream (it stalls there for 20 s), not only asked for, to be aborted.
        try upstream.waitForStats("page 2 at the upstream") { $0["counters"]?["c:2"]?.intValue == 1 }
        _ = try engine.answer("cancel") { done in engine.cancel(id: job.id) { done($0) } }
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .cancelled)
        try upstream.waitForStats("the upstream seeing the disconnect") { $0["disconnects"]?.arrayValue?.isEmpty == false }
        XCTAssertEqual(try upstream.stats()["disconnects"]?.arrayValue?.count, 1, "page 2 was aborted upstream")
        XCTAssertEqual(try counter("c:3"), 0)
    }

    func testTimeoutCoversTheWholeWalk() throws {
        let engine = try makeEngine()
        // Each page alone is quick enough; the three together are not.
        let job = try submit(
            engine,
            page("/pages/link?n=3&per=1&slow=3&slow_ms=20000", #"{"next": "link", "items": "/body"}"#,
                 extra: #""timeout_ms": 800, "#))
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.error?.kind, .timeout)
        XCTAssertEqual(try engine.node(jobID: job.id, nodeID: "walk")?.pages, 2)
    }

    func testAfterARestartTheWalkStartsAgainFromTheFirstPage() throws {
        var engine = try makeEngine(dbName: "restart.sqlite")
        let graph = page("/pages/link?n=3&per=2&slow=3&slow_ms=1500&key=k", #"{"next": "link", "items": "/body"}"#)
        let job = try submit(engine, graph)
        _ = try waitForRoot(engine, job.id) { $0.pages == 2 }
        engine.shutdown(gracePeriodMs: 2000)
        engines.removeAll { $0 === engine }
        engine = try makeEngine(dbName: "restart.sqlite")
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.result?["items"], ids(1...6))
        XCTAssertEqual(done.result?["pages"], 3)
        XCTAssertEqual(try counter("k:1"), 2, "page 1 was fetched again")
    }
}
