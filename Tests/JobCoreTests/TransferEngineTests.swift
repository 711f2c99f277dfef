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

    /// Polls (at most `seconds`) until the job is settled.
    func settledJob(_ engine: Engine, _ id: String, seconds: Double = 20) throws -> JobRecord {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let job = try engine.job(id: id), job.state.isSettled, job.progress.pending + job.progress.running == 0 {
                return job
            }
            let done = DispatchSemaphore(value: 0)
            _ = engine.waitForChange(id: id, afterVersion: try engine.job(id: id)?.version, timeoutMs: 200) { _ in done.signal() }
            done.wait()
        }
        throw UpstreamError("job \(id) did not settle within \(seconds) s")
    }

    /// Polls (at most `seconds`) until `condition` holds.
    func eventually(_ what: String, seconds: Double = 10, _ condition: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try condition() { return }
            usleep(20_000)
        }
        throw UpstreamError("\(what) did not happen within \(seconds) s")
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
        for id in ids { XCTAssertEqual(try settledJob(engine, id).state, .succeeded) }
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
        let engine = try makeEngine { $0.hostRates = [HostRate(host: "*", perSecond: 1)] }
        let first = try submitJob(engine, #"{"type":"fetch","url":\#(u("/json"))}"#)
        XCTAssertEqual(try settledJob(engine, first.id).state, .succeeded)
        // The next start to this host is about a second away: a 100 ms timeout passes while it waits.
        let second = try submitJob(engine, #"{"type":"fetch","url":\#(u("/json")),"timeout_ms":100}"#)
        let job = try settledJob(engine, second.id)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .timeout)
    }
}

/// The token buckets of `--host-rate`, on an injected clock.
final class HostRateLimiterTests: XCTestCase {
    func testStartsToALimitedHostAreSpacedAndOtherHostsAreFree() throws {
        var limiter = HostRateLimiter([try HostRate(parsing: "api.local=10/s")])
        let t0: UInt64 = 5_000_000_000
        XCTAssertNil(limiter.take(hostKey: "http://api.local:80", nowNs: t0))
        let due = try XCTUnwrap(limiter.take(hostKey: "https://api.local", nowNs: t0 + 1))
        XCTAssertEqual(due, t0 + 102_000_000, "1/10 s plus the 2 % margin")
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
