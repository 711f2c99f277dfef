import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// `cache: "use"` through the engine, against the fixture's `/cache/{key}` (API.md §9).
final class HTTPCacheEngineTests: EngineTestCase {
    func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    func cachedEngine(capacityBytes: Int = 1 << 20) throws -> Engine {
        let path = directory + "/cache.sqlite"
        let store = try SQLiteJobStore(path: path)
        var fetcherConfig = FetcherConfiguration()
        fetcherConfig.denyCIDRs = []
        let engine = Engine(store: store, fetcher: try Fetcher(configuration: fetcherConfig),
                            configuration: EngineConfiguration(), logger: .disabled)
        engine.httpCache = try HTTPCache(path: path, capacityBytes: capacityBytes)
        try engine.start()
        engines.append(engine)
        return engine
    }

    /// Runs one `cache: "use"` fetch job to the end and returns its result.
    func fetch(_ engine: Engine, _ path: String, headers: String = "{}") throws -> JSONValue? {
        let json = try JSONValue.parse(#"{"graph":{"type":"fetch","url":\#(u(path)),"cache":"use","headers":\#(headers)}}"#)
        guard case .created(let job) = try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) else {
            throw UpstreamError("not created")
        }
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if let now = try engine.job(id: job.id), now.state.isSettled { return now.result ?? now.error?.json }
            let done = DispatchSemaphore(value: 0)
            _ = engine.waitForChange(id: job.id, afterVersion: try engine.job(id: job.id)?.version, timeoutMs: 200) { _ in done.signal() }
            done.wait()
        }
        throw UpstreamError("job \(job.id) did not settle")
    }

    func requests(_ key: String) throws -> Int { try upstream.stats()["counters"]?[key]?.intValue ?? 0 }

    func testFreshResponseIsUsedWithoutARequest() throws {
        let engine = try cachedEngine()
        let first = try fetch(engine, "/cache/fresh?cc=max-age=60")
        XCTAssertEqual(first?["cache"], "miss")
        let second = try fetch(engine, "/cache/fresh?cc=max-age=60")
        XCTAssertEqual(second?["cache"], "hit")
        XCTAssertEqual(second?["body"]?["count"], 1)
        XCTAssertEqual(second?["status"], 200)
        XCTAssertEqual(try requests("fresh"), 1)
        let metrics = try engine.metricsNow.transfer
        XCTAssertEqual(metrics.cacheOutcomes["hit"], 1)
        XCTAssertEqual(metrics.cacheOutcomes["miss"], 1)
        XCTAssertEqual(metrics.cacheEntries, 1)
    }

    func testStaleResponseIsRevalidatedWithIfNoneMatchAndReusedOn304() throws {
        let engine = try cachedEngine()
        // Age 5 over max-age 2: stale as soon as it is stored.
        XCTAssertEqual(try fetch(engine, "/cache/stale?cc=max-age=2&age=5")?["cache"], "miss")
        let again = try fetch(engine, "/cache/stale?cc=max-age=2&age=5")
        XCTAssertEqual(again?["cache"], "revalidated")
        XCTAssertEqual(again?["status"], 200)
        XCTAssertEqual(again?["body"]?["count"], 1, "the stored body, not a new one")
        XCTAssertEqual(try requests("stale"), 2)
        XCTAssertEqual(try requests("stale:304"), 1)
    }

    func testNoStoreIsNeverStoredAndNoCacheAlwaysRevalidates() throws {
        let engine = try cachedEngine()
        XCTAssertEqual(try fetch(engine, "/cache/ns?cc=no-store")?["cache"], "miss")
        XCTAssertEqual(try fetch(engine, "/cache/ns?cc=no-store")?["cache"], "miss")
        XCTAssertEqual(try requests("ns"), 2)
        XCTAssertEqual(try engine.metricsNow.transfer.cacheEntries, 0)
        XCTAssertEqual(try fetch(engine, "/cache/nc?cc=no-cache,max-age=60")?["cache"], "miss")
        XCTAssertEqual(try fetch(engine, "/cache/nc?cc=no-cache,max-age=60")?["cache"], "revalidated")
        XCTAssertEqual(try requests("nc:304"), 1)
    }

    func testVaryKeepsResponsesForOtherHeaderValuesApart() throws {
        let engine = try cachedEngine()
        let path = "/cache/vary?cc=max-age=60&vary=X-Lang"
        XCTAssertEqual(try fetch(engine, path, headers: #"{"X-Lang":"en"}"#)?["cache"], "miss")
        XCTAssertEqual(try fetch(engine, path, headers: #"{"X-Lang":"en"}"#)?["cache"], "hit")
        XCTAssertEqual(try fetch(engine, path, headers: #"{"X-Lang":"fr"}"#)?["cache"], "miss")
        XCTAssertEqual(try requests("vary"), 2)
    }

    func testResponsesAreKeptApartByCredentials() throws {
        let engine = try cachedEngine()
        let path = "/cache/creds?cc=max-age=60"
        XCTAssertEqual(try fetch(engine, path, headers: #"{"Authorization":"Bearer a"}"#)?["cache"], "miss")
        XCTAssertEqual(try fetch(engine, path, headers: #"{"Authorization":"Bearer b"}"#)?["cache"], "miss")
        XCTAssertEqual(try fetch(engine, path, headers: #"{"Authorization":"Bearer a"}"#)?["cache"], "hit")
        XCTAssertEqual(try fetch(engine, path)?["cache"], "miss")
        XCTAssertEqual(try requests("creds"), 3)
    }

    func testTheCacheNeverGrowsPastItsBoundAndDropsTheLeastRecentlyUsed() throws {
        let engine = try cachedEngine(capacityBytes: 8 * 1024)
        for k in 0..<40 {
            XCTAssertEqual(try fetch(engine, "/cache/lru\(k)?cc=max-age=60&size=600")?["cache"], "miss")
            XCTAssertLessThanOrEqual(try engine.metricsNow.transfer.cacheBytes, 8 * 1024)
        }
        let metrics = try engine.metricsNow.transfer
        XCTAssertGreaterThan(metrics.cacheEntries, 3)
        XCTAssertLessThan(metrics.cacheEntries, 40)
        XCTAssertEqual(try fetch(engine, "/cache/lru39?cc=max-age=60&size=600")?["cache"], "hit")
        XCTAssertEqual(try fetch(engine, "/cache/lru0?cc=max-age=60&size=600")?["cache"], "miss")
    }

    func testStoredResponsesSurviveARestart() throws {
        let first = try cachedEngine()
        XCTAssertEqual(try fetch(first, "/cache/kept?cc=max-age=600")?["cache"], "miss")
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let second = try cachedEngine()
        XCTAssertEqual(try second.metricsNow.transfer.cacheEntries, 1)
        XCTAssertEqual(try fetch(second, "/cache/kept?cc=max-age=600")?["cache"], "hit")
        XCTAssertEqual(try requests("kept"), 1)
    }

    func testCoalescedCachedFetchesShareOneRequestAndEachIsAMiss() throws {
        let engine = try cachedEngine()
        var ids: [String] = []
        for _ in 0..<3 {
            let json = try JSONValue.parse(
                #"{"graph":{"type":"fetch","url":\#(u("/cache/both?cc=max-age=600&delay_ms=600")),"cache":"use","coalesce":true}}"#)
            guard case .created(let job) = try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) else {
                throw UpstreamError("not created")
            }
            ids.append(job.id)
        }
        for id in ids { _ = try settled(engine, id) }
        for id in ids {
            let job = try XCTUnwrap(engine.job(id: id))
            XCTAssertEqual(job.state, .succeeded)
            XCTAssertEqual(job.result?["body"]?["count"], 1)
        }
        XCTAssertEqual(try requests("both"), 1)
        XCTAssertEqual(try engine.metricsNow.transfer.coalescedFetches, 2)
        XCTAssertEqual(try engine.metricsNow.transfer.cacheOutcomes["miss"], 3)
        XCTAssertEqual(try fetch(engine, "/cache/both?cc=max-age=600&delay_ms=600")?["cache"], "hit")
    }

    func testCacheOffNeverLooks() throws {
        let engine = try cachedEngine()
        for _ in 0..<2 {
            let json = try JSONValue.parse(#"{"graph":{"type":"fetch","url":\#(u("/cache/off?cc=max-age=60"))}}"#)
            _ = try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil)
        }
        try upstream.waitForStats("two requests for /cache/off") { ($0["counters"]?["off"]?.intValue ?? 0) >= 2 }
        XCTAssertEqual(try requests("off"), 2)
        XCTAssertEqual(try engine.metricsNow.transfer.cacheEntries, 0)
    }
}

/// RFC 9111 freshness, storability and header updates, on fixed times.
final class HTTPCachePolicyTests: XCTestCase {
    let date = "Sun, 06 Nov 1994 08:49:37 GMT"
    let dateMs: Int64 = 784_111_777_000

    func testHTTPDatesParse() {
        XCTAssertEqual(HTTPCachePolicy.httpDateMs(date), dateMs)
        XCTAssertEqual(HTTPCachePolicy.httpDateMs("Thu, 01 Jan 1970 00:00:00 GMT"), 0)
        XCTAssertNil(HTTPCachePolicy.httpDateMs("0"))
        XCTAssertNil(HTTPCachePolicy.httpDateMs("Sunday, 06-Nov-94 08:49:37 GMT"))
    }

    func testFreshnessFromMaxAgeExpiresAndAge() {
        func fresh(_ headers: [(String, String)], at nowMs: Int64, request: [(String, String)] = []) -> Bool {
            HTTPCachePolicy.isFresh(responseHeaders: headers.map { (name: $0.0, value: $0.1) },
                                    requestHeaders: request.map { (name: $0.0, value: $0.1) },
                                    requestTimeMs: dateMs, responseTimeMs: dateMs, nowMs: nowMs)
        }
        XCTAssertTrue(fresh([("cache-control", "max-age=2"), ("date", date)], at: dateMs + 1999))
        XCTAssertFalse(fresh([("cache-control", "max-age=2"), ("date", date)], at: dateMs + 2000))
        XCTAssertFalse(fresh([("cache-control", "max-age=2"), ("age", "2")], at: dateMs))
        XCTAssertTrue(fresh([("expires", "Sun, 06 Nov 1994 08:49:47 GMT"), ("date", date)], at: dateMs + 9000))
        XCTAssertFalse(fresh([("expires", "Sun, 06 Nov 1994 08:49:47 GMT"), ("date", date)], at: dateMs + 10000))
        XCTAssertFalse(fresh([("expires", "0")], at: dateMs))
        XCTAssertTrue(fresh([("cache-control", "max-age=60, expires-ignored"), ("expires", "0")], at: dateMs))
        XCTAssertFalse(fresh([("cache-control", "no-cache, max-age=60")], at: dateMs))
        XCTAssertFalse(fresh([("cache-control", "max-age=60")], at: dateMs, request: [("Cache-Control", "no-cache")]))
        XCTAssertFalse(fresh([("etag", "\"x\"")], at: dateMs), "no heuristic freshness")
    }

    func testWhatMayBeStored() {
        func refusal(_ status: Int, _ headers: [(String, String)], request: [(String, String)] = []) -> String? {
            HTTPCachePolicy.refusal(status: status, requestHeaders: request.map { (name: $0.0, value: $0.1) },
                                    responseHeaders: headers.map { (name: $0.0, value: $0.1) })
        }
        XCTAssertNil(refusal(200, [("cache-control", "max-age=5")]))
        XCTAssertNil(refusal(200, [("cache-control", "private"), ("etag", "\"a\"")]), "a private cache stores private")
        XCTAssertEqual(refusal(200, [("cache-control", "no-store, max-age=5")]), "no-store")
        XCTAssertEqual(refusal(200, [("cache-control", "max-age=5")], request: [("Cache-Control", "no-store")]), "no-store")
        XCTAssertEqual(refusal(200, [("cache-control", "max-age=5"), ("vary", "Accept, *")]), "Vary: *")
        XCTAssertEqual(refusal(201, [("cache-control", "max-age=5")]), "status 201")
        XCTAssertNotNil(refusal(200, [("content-type", "text/plain")]))
    }

    func testA304UpdatesTheStoredFieldsButNotThoseOfTheBody() {
        let stored: [(name: String, value: String)] = [("content-type", "application/json"), ("etag", "\"a\""), ("date", "x")]
        let updated = HTTPCachePolicy.updated(stored, with: [("date", "y"), ("content-type", "text/html"), ("x-new", "1")])
        XCTAssertEqual(updated.map { "\($0.name)=\($0.value)" }, ["content-type=application/json", "etag=\"a\"", "date=y", "x-new=1"])
        XCTAssertEqual(HTTPCachePolicy.validators([("etag", "\"a\""), ("last-modified", date)]).map(\.name),
                       ["If-None-Match", "If-Modified-Since"])
    }
}
