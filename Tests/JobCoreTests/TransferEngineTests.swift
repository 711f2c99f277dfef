import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// The transfer layer in the engine (API.md §9): rate limits, coalescing, the HTTP cache.
final class TransferEngineTests: EngineTestCase {
    func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    func submitJob(_ engine: Engine, _ graph: String) throws -> JobRecord {
        let json = try JSONValue.parse(#"{"graph": \#(graph)}"#)
        switch try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) {
        case .created(let job), .existing(let job): return job
        case let other: throw UpstreamError("submit answered \(other)")
        }
    }

    // MARK: - --host-rate

    func testHostRateSpacesStartsOverAllJobs() throws {
        let engine = try makeEngine { $0.hostRates = [HostRate(host: "127.0.0.1", perSecond: 20)] }
        var ids: [String] = []
        for j in 0..<6 {
            let children = (0..<5).map { k in "{\"type\":\"fetch\",\"url\":\(u("/rate/r\(j)-\(k)"))}" }
                .joined(separator: ",")
            ids.append(try submitJob(engine, #"{"type":"list","children":[\#(children)]}"#).id)
        }
        for id in ids { XCTAssertEqual(try settled(engine, id).state, .succeeded) }
        let arrivals = (try upstream.stats()["arrivals"]?.objectValue ?? [])
            .flatMap { $0.value.arrayValue ?? [] }.compactMap(\.doubleValue).sorted()
        XCTAssertEqual(arrivals.count, 30)
        // No second holds more than 20 arrivals: any 21 in a row span at least a second.
        for i in 20..<arrivals.count {
            XCTAssertGreaterThanOrEqual(arrivals[i] - arrivals[i - 20], 1.0, "arrivals \(i - 20)…\(i)")
        }
        let metrics = try engine.metricsNow
        XCTAssertGreaterThan(metrics.transfer.rateLimitedFetches, 0)
        XCTAssertGreaterThan(metrics.transfer.rateLimitWaitMs, 0)
    }

    func testRateWaitCountsInTheNodesTimeout() throws {
        let engine = try makeEngine { $0.hostRates = [HostRate(host: "*", perSecond: 0.2)] }
        let first = try submitJob(engine, #"{"type":"fetch","url":\#(u("/json"))}"#)
        XCTAssertEqual(try settled(engine, first.id).state, .succeeded)
        // The next start to this host is about 5 s away: a 100 ms timeout passes while it waits.
        let second = try submitJob(engine, #"{"type":"fetch","url":\#(u("/json")),"timeout_ms":100}"#)
        let job = try settled(engine, second.id)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .timeout)
    }

    // MARK: - coalesce

    /// Submits `count` one-fetch jobs for `url` with coalesce and waits until the later ones all joined the first.
    func coalescedJobs(_ engine: Engine, _ url: String, count: Int) throws -> [String] {
        var ids: [String] = []
        for _ in 0..<count {
            ids.append(try submitJob(engine, #"{"type":"fetch","url":\#(u(url)),"coalesce":true}"#).id)
        }
        // A fetch joins the transfer in flight (or starts it) in the turn that marks it running: once every one has
        // left pending, the count is final.
        for id in ids {
            let began = try untilJob(engine, id) { try engine.node(jobID: id, nodeID: "root")?.state != .pending }
            if !began { throw UpstreamError("the fetch of job \(id) never began") }
        }
        let joined = try engine.metricsNow.transfer.coalescedFetches
        if joined != count - 1 { throw UpstreamError("\(joined) fetches joined the first, not \(count - 1)") }
        return ids
    }

    func testIdenticalFetchesShareOneRequestAndEachGetsTheBody() throws {
        let engine = try makeEngine()
        let ids = try coalescedJobs(engine, "/count/shared?delay_ms=800", count: 8)
        var joined = 0
        for id in ids {
            let job = try settled(engine, id)
            XCTAssertEqual(job.state, .succeeded)
            XCTAssertEqual(job.result?["body"]?["count"], 1)
            if job.result?["coalesced"] == .bool(true) { joined += 1 } else { XCTAssertEqual(job.result?["coalesced"], .bool(false)) }
        }
        XCTAssertEqual(joined, 7)
        XCTAssertEqual(try upstream.stats()["counters"]?["shared"]?.intValue, 1)
    }

    /// Each fetch that joins gives its slot back from inside the pump that gave it one; the pump takes the slot on its
    /// next turn rather than calling itself, which for thousands of joins in a row would run off the stack.
    func testThousandsOfFetchesJoiningInARowShareOneRequest() throws {
        let engine = try makeEngine()
        let count = 5000
        let child = #"{"type":"fetch","url":\#(u("/count/row?delay_ms=500")),"coalesce":true}"#
        let job = try submitJob(engine, #"{"type":"list","children":[\#(Array(repeating: child, count: count).joined(separator: ","))]}"#)
        let settled = try settled(engine, job.id)
        XCTAssertEqual(settled.state, .succeeded)
        XCTAssertEqual(settled.result?.arrayValue?.count, count)
        XCTAssertEqual(try upstream.stats()["counters"]?["row"]?.intValue, 1)
        XCTAssertEqual(try engine.metricsNow.transfer.coalescedFetches, count - 1)
    }

    func testDifferentHeadersDoNotShare() throws {
        let engine = try makeEngine()
        let a = try submitJob(engine, #"{"type":"fetch","url":\#(u("/count/h?delay_ms=300")),"coalesce":true,"headers":{"X-A":"1"}}"#)
        let b = try submitJob(engine, #"{"type":"fetch","url":\#(u("/count/h?delay_ms=300")),"coalesce":true,"headers":{"X-A":"2"}}"#)
        XCTAssertEqual(try settled(engine, a.id).state, .succeeded)
        XCTAssertEqual(try settled(engine, b.id).state, .succeeded)
        XCTAssertEqual(try upstream.stats()["counters"]?["h"]?.intValue, 2)
    }

    func testCancellingAllButOneSharerLeavesTheTransferRunning() throws {
        let engine = try makeEngine()
        let ids = try coalescedJobs(engine, "/count/keep?delay_ms=1500", count: 4)
        for id in ids.dropLast() {
            _ = try engine.answer("cancel") { done in engine.cancel(id: id) { done($0) } }
        }
        let last = try settled(engine, ids[3])
        XCTAssertEqual(last.state, .succeeded)
        XCTAssertEqual(last.result?["body"]?["count"], 1)
        XCTAssertEqual(try upstream.stats()["disconnects"]?.arrayValue?.count, 0)
        for id in ids.dropLast() { XCTAssertEqual(try settled(engine, id).state, .cancelled) }
    }

    func testCancellingEverySharerAbortsTheTransfer() throws {
        let engine = try makeEngine()
        let ids = try coalescedJobs(engine, "/hang", count: 3)
        // The upstream sees the abort only of a request that reached it.
        try upstream.waitForStats("the shared request at the upstream") { $0["max_active_by_path_prefix"]?["/hang"]?.intValue == 1 }
        for id in ids {
            _ = try engine.answer("cancel") { done in engine.cancel(id: id) { done($0) } }
        }
        try upstream.waitForStats("the upstream seeing the disconnect") { $0["disconnects"]?.arrayValue?.count == 1 }
        for id in ids { XCTAssertEqual(try settled(engine, id).state, .cancelled) }
    }
}


/// `coalesce` and `cache` at submit: each misuse refused with its JSON Pointer.
final class TransferValidationTests: XCTestCase {
    private func firstIssue(_ graph: String) -> ValidationIssue? {
        do {
            _ = try JobSpec.parse(try JSONValue.parse(#"{"graph": \#(graph)}"#))
            return nil
        } catch let error as ValidationError {
            return error.issues.first
        } catch {
            return nil
        }
    }

    func testMisusesAreRefusedWithTheirPointer() {
        let table: [(String, String, String)] = [
            (#"{"type":"fetch","url":"http://a/","method":"POST","coalesce":true}"#, "/graph/coalesce", "GET or HEAD"),
            (#"{"type":"fetch","url":"http://a/","json":{},"coalesce":true}"#, "/graph/coalesce", "without a body"),
            (#"{"type":"fetch","url":"http://a/","coalesce":"yes"}"#, "/graph/coalesce", "boolean"),
            (#"{"type":"fetch","url":"http://a/","method":"HEAD","cache":"use"}"#, "/graph/cache", "GET request"),
            (#"{"type":"fetch","url":"http://a/","cache":"always"}"#, "/graph/cache", "\"use\" or \"off\""),
            (#"{"type":"list","children":[{"type":"fetch","url":"http://a/","method":"PUT","cache":"use"}]}"#,
             "/graph/children/0/cache", "GET request"),
        ]
        for (graph, pointer, fragment) in table {
            let issue = firstIssue(graph)
            XCTAssertEqual(issue?.pointer, pointer, graph)
            XCTAssertTrue(issue?.message.contains(fragment) == true, "\(String(describing: issue)) for \(graph)")
        }
    }

    func testGoodUsesAreAccepted() throws {
        for graph in [
            #"{"type":"fetch","url":"http://a/","coalesce":true,"cache":"use"}"#,
            #"{"type":"fetch","url":"http://a/","method":"HEAD","coalesce":true,"cache":"off"}"#,
            #"{"type":"fetch","url":"http://a/","method":"POST","coalesce":false}"#,
        ] {
            XCTAssertNil(firstIssue(graph), graph)
        }
    }
}

/// The token buckets of `--host-rate`, on an injected clock.
final class HostRateLimiterTests: XCTestCase {
    func testStartsToALimitedHostAreSpacedAndOtherHostsAreFree() throws {
        var limiter = HostRateLimiter([try HostRate(parsing: "api.local=10/s")])
        let t0: UInt64 = 5_000_000_000
        XCTAssertNil(limiter.take(hostKey: "http://api.local:80", nowNs: t0))
        let due = try XCTUnwrap(limiter.take(hostKey: "https://api.local", nowNs: t0 + 1), "every scheme and port share the host's bucket")
        XCTAssertEqual(due, t0 + 105_000_000, "1/10 s plus the 5 % margin")
        XCTAssertNotNil(limiter.take(hostKey: "http://api.local:80", nowNs: due - 1))
        XCTAssertNil(limiter.take(hostKey: "http://api.local:80", nowNs: due))
        XCTAssertNil(limiter.take(hostKey: "http://other.local", nowNs: t0))
        XCTAssertNil(limiter.take(hostKey: "http://other.local", nowNs: t0))
    }

    func testWildcardLimitsEveryHostSeparatelyAndANamedHostWins() throws {
        var limiter = HostRateLimiter([try HostRate(parsing: "*=1/s"), try HostRate(parsing: "fast.local=1000/s")])
        XCTAssertNil(limiter.take(hostKey: "http://a.local", nowNs: 0))
        XCTAssertNil(limiter.take(hostKey: "http://b.local", nowNs: 0))
        XCTAssertNotNil(limiter.take(hostKey: "http://a.local", nowNs: 500_000_000))
        XCTAssertNil(limiter.take(hostKey: "http://fast.local", nowNs: 0))
        XCTAssertNil(limiter.take(hostKey: "http://fast.local", nowNs: 1_100_000))
        XCTAssertNil(limiter.take(hostKey: "http://[::1]:8080", nowNs: 0))
        XCTAssertEqual(HostRateLimiter.hostName(of: "http://[::1]:8080"), "::1")
    }

    func testBadRatesAreRefusedWithTheReason() {
        for text in ["api.local", "api.local=20", "api.local=0/s", "api.local=-1/s", "=5/s", "a/b=5/s", "x=abc/s"] {
            XCTAssertThrowsError(try HostRate(parsing: text), text)
        }
        XCTAssertEqual(try HostRate(parsing: "[::1]=2.5/s").host, "::1")
        XCTAssertEqual(try HostRate(parsing: "API.Local=20/s").host, "api.local")
    }
}

/// The key of the per-host limit, found in a URL's bytes.
final class FetchQueueHostKeyTests: XCTestCase {
    func testTheKeyIsSchemeHostAndPortLowercasedWithoutUserinfoPathOrQuery() {
        let rows: [(url: String, key: String)] = [
            ("http://127.0.0.1:8080/data.json?i=1", "http://127.0.0.1:8080"),
            ("HTTPS://API.Example.COM/x#frag", "https://api.example.com"),
            ("http://user:pw@host:81/p", "http://host:81"),
            ("http://a@b@host?q=1", "http://host"),
            ("http://@host/", "http://host"),
            ("http://user@/p", "http://user"),
            ("http://@@/p", "http://@@"),
            ("http://host#x@y", "http://host"),
            ("http:///path", "http://"),
            ("http://ÉTÉ.example/", "http://été.example"),
            ("not a url", "not a url"),
        ]
        for row in rows { XCTAssertEqual(FetchQueue.hostKey(of: row.url), row.key, row.url) }
    }
}
