import Foundation
import TestSupport
import Threads
import XCTest

@testable import JobCore

/// `--host-rate` over several stores on one database, as several servers (API.md §10).
final class PostgresHostRateTests: PostgresDatabaseTestCase {
    private func value(_ sql: String) throws -> Int64? {
        try raw(sql).first?.first.flatMap { $0 }.flatMap { Int64($0) }
    }

    func testStoresBookTheStartsOfAHostOnOneSchedule() throws {
        let first = try PostgresJobStore(url: databaseURL)
        defer { first.close() }
        let second = try PostgresJobStore(url: databaseURL)
        defer { second.close() }
        let before = try XCTUnwrap(value("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"))
        let held = Watched<[UInt64]>([])
        for _ in 0..<3 {
            first.awaitHostStart("h", perSecond: 50, jobID: "J") { if let ns = $0 { held.withLock { $0.append(ns) } } }
            second.awaitHostStart("h", perSecond: 50, jobID: "J") { if let ns = $0 { held.withLock { $0.append(ns) } } }
        }
        first.awaitHostStart("other", perSecond: 50, jobID: "J") { if let ns = $0 { held.withLock { $0.append(ns) } } }
        XCTAssertTrue(held.wait(milliseconds: 10_000) { $0.count == 7 }, "every booked start came")
        let next = try XCTUnwrap(value("SELECT next_start_us FROM host_rates WHERE host = 'h'"))
        let interval = Int64(1e6 / 50 * 1.05)
        XCTAssertGreaterThanOrEqual(next - before, 6 * interval, "the six starts of both stores are on one schedule")
    }

    func testClosingAnswersTheFetchesStillWaiting() throws {
        let store = try PostgresJobStore(url: databaseURL)
        let answers = Watched<[UInt64?]>([])
        // At 0.1/s the second start is booked 10.5 s later; closing does not wait for it.
        store.awaitHostStart("h", perSecond: 0.1, jobID: "J") { ns in answers.withLock { $0.append(ns) } }
        store.awaitHostStart("h", perSecond: 0.1, jobID: "J") { ns in answers.withLock { $0.append(ns) } }
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 1 })
        store.close()
        XCTAssertEqual(answers.withLock { $0 }, [0, nil])
        store.awaitHostStart("h", perSecond: 0.1, jobID: "J") { ns in answers.withLock { $0.append(ns) } }
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 3 })
        XCTAssertEqual(answers.withLock { $0.last }, .some(nil), "a closed store books nothing")
    }

    func testWithdrawingAJobAnswersOnlyItsFetches() throws {
        let store = try PostgresJobStore(url: databaseURL)
        defer { store.close() }
        let answers = Watched<[String]>([])
        func wait(_ name: String, _ jobID: String) {
            store.awaitHostStart("h", perSecond: 0.1, jobID: jobID) { ns in
                answers.withLock { $0.append("\(name) \(ns.map { $0 == 0 ? "now" : "later" } ?? "withdrawn")") }
            }
        }
        // At 0.1/s only the first start is now; the others are booked 10.5 s apart.
        wait("a1", "A")
        wait("b1", "B")
        wait("a2", "A")
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 1 })
        store.withdrawHostStarts(jobID: "B")
        XCTAssertTrue(answers.wait(milliseconds: 10_000) { $0.count == 2 })
        XCTAssertEqual(answers.withLock { $0 }, ["a1 now", "b1 withdrawn"], "a2 of the other job still waits")
    }
}

/// Two engines on one database, as two servers, each with the same `--host-rate`: together they keep to it.
final class PostgresHostRateEngineTests: EngineTestCase {
    override class var usesPostgres: Bool { true }

    private func submit(_ engine: Engine, _ graph: String) throws -> JobRecord {
        let json = try JSONValue.parse(#"{"graph": \#(graph)}"#)
        switch try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) {
        case .created(let job), .existing(let job): return job
        case let other: throw UpstreamError("submit answered \(other)")
        }
    }

    func testTwoServersTogetherKeepToTheRate() throws {
        let rate = [HostRate(host: "127.0.0.1", perSecond: 20)]
        let engines = [try makeEngine { $0.hostRates = rate }, try makeEngine { $0.hostRates = rate }]
        var submitted: [(Engine, String)] = []
        for j in 0..<6 {
            let engine = engines[j % 2]
            let children = (0..<5).map { k in "{\"type\":\"fetch\",\"url\":\"\(upstream.url("/rate/r\(j)-\(k)"))\"}" }
            submitted.append((engine, try submit(engine, #"{"type":"list","children":[\#(children.joined(separator: ","))]}"#).id))
        }
        for (engine, id) in submitted { XCTAssertEqual(try settled(engine, id, seconds: 20).state, .succeeded) }
        let arrivals = (try upstream.stats()["arrivals"]?.objectValue ?? [])
            .flatMap { $0.value.arrayValue ?? [] }.compactMap(\.doubleValue).sorted()
        XCTAssertEqual(arrivals.count, 30)
        // Each alone may start 20 a second; no second holds more than 20 over both: any 21 in a row span a second.
        for i in 20..<arrivals.count {
            XCTAssertGreaterThanOrEqual(arrivals[i] - arrivals[i - 20], 1.0, "arrivals \(i - 20)…\(i)")
        }
        for engine in engines { XCTAssertGreaterThan(try engine.metricsNow.transfer.rateLimitedFetches, 0) }
    }

    func testRateWaitCountsInTheNodesTimeout() throws {
        let engine = try makeEngine { $0.hostRates = [HostRate(host: "*", perSecond: 0.2)] }
        let first = try submit(engine, #"{"type":"fetch","url":"\#(upstream.url("/json"))"}"#)
        XCTAssertEqual(try settled(engine, first.id, seconds: 20).state, .succeeded)
        // The next start to this host is booked about 5 s away: a 100 ms timeout passes while it waits.
        let second = try submit(engine, #"{"type":"fetch","url":"\#(upstream.url("/json"))","timeout_ms":100}"#)
        let job = try settled(engine, second.id, seconds: 20)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .timeout)
    }
}
