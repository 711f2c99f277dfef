import Foundation
import TestSupport
import Threads
import XCTest

@testable import JobCore

/// `--host-rate` over several stores on one database, as several servers (API.md §10).
final class PostgresHostRateTests: XCTestCase {
    static let postgres = PostgresTestCluster()
    var databaseURL = ""

    override class func setUp() {
        super.setUp()
        postgres.start()
    }

    override class func tearDown() {
        postgres.stop()
        super.tearDown()
    }

    override func setUpWithError() throws {
        try super.setUpWithError()
        databaseURL = try Self.postgres.freshDatabase()
    }

    private func value(_ sql: String) throws -> Int64? {
        let db = try PostgresConnection(url: databaseURL)
        defer { db.close() }
        return try db.execute(sql).rows.first?.first.flatMap { $0 }.flatMap { Int64($0) }
    }

    func testStoresBookTheStartsOfAHostOnOneSchedule() throws {
        let first = try PostgresJobStore(url: databaseURL)
        defer { first.close() }
        let second = try PostgresJobStore(url: databaseURL)
        defer { second.close() }
        let before = try XCTUnwrap(value("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"))
        let held = Locked<[UInt64]>([])
        for _ in 0..<3 {
            first.awaitHostStart("h", perSecond: 50) { if let ns = $0 { held.withLock { $0.append(ns) } } }
            second.awaitHostStart("h", perSecond: 50) { if let ns = $0 { held.withLock { $0.append(ns) } } }
        }
        first.awaitHostStart("other", perSecond: 50) { if let ns = $0 { held.withLock { $0.append(ns) } } }
        XCTAssertTrue(TestSupport.eventually { held.withLock { $0.count } == 7 }, "every booked start came")
        let next = try XCTUnwrap(value("SELECT next_start_us FROM host_rates WHERE host = 'h'"))
        let interval = Int64(1e6 / 50 * 1.05)
        XCTAssertGreaterThanOrEqual(next - before, 6 * interval, "the six starts of both stores are on one schedule")
    }

    func testClosingAnswersTheFetchesStillWaiting() throws {
        let store = try PostgresJobStore(url: databaseURL)
        let answers = Locked<[UInt64?]>([])
        // At 0.1/s the second start is booked 10.5 s later; closing does not wait for it.
        store.awaitHostStart("h", perSecond: 0.1) { ns in answers.withLock { $0.append(ns) } }
        store.awaitHostStart("h", perSecond: 0.1) { ns in answers.withLock { $0.append(ns) } }
        XCTAssertTrue(TestSupport.eventually { answers.withLock { $0.count } == 1 })
        store.close()
        XCTAssertEqual(answers.withLock { $0 }, [0, nil])
        store.awaitHostStart("h", perSecond: 0.1) { ns in answers.withLock { $0.append(ns) } }
        XCTAssertTrue(TestSupport.eventually { answers.withLock { $0.count } == 3 })
        XCTAssertEqual(answers.withLock { $0.last }, .some(nil), "a closed store books nothing")
    }
}
