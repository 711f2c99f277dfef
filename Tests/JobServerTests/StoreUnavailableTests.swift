import Foundation
import TestSupport
import XCTest

@testable import JobCore
@testable import JobServer

/// The store-failure policy seen from the API, with a real failure: another connection holds the
/// database's write lock, so every write of the server fails with SQLITE_BUSY until it lets go.
final class StoreUnavailableTests: XCTestCase {
    func testALockedStoreAnswers503DegradedAndWritesACancelOnceItCan() throws {
        let upstream = try Upstream.start()
        defer { upstream.stop() }
        let harness = try AppHarness()
        defer { harness.shutdown() }
        let id = harness.submit(fetchJob(upstream.url("/hang")))

        let other = try SQLiteConnection(path: harness.config.dbPath, create: false, busyTimeoutMs: 100)
        defer { other.close() }
        try other.execute("BEGIN IMMEDIATE")

        // The writer waits out its busy timeout, then gives up: a resource failure, not a bug.
        let refused = harness.call(.submitJob, body: fetchJob(upstream.url("/json")), timeout: 60)
        XCTAssertEqual(refused.status, 503, refused.text)
        XCTAssertEqual(refused.errorCode, "storage_unavailable")
        XCTAssertEqual(refused.headers["Retry-After"], "1")

        let health = harness.call(.health)
        XCTAssertEqual(health.status, 503, health.text)
        XCTAssertEqual(health.json?["status"]?.stringValue, "degraded")
        XCTAssertEqual(health.json?["store"]?["writable"], .bool(false))
        XCTAssertNotNil(health.headers["Retry-After"])
        let metrics = harness.call(.metrics).text
        XCTAssertTrue(metrics.contains("\njobserver_store_degraded 1\n"), metrics)
        XCTAssertFalse(metrics.contains("\njobserver_store_write_failures_total 0\n"), metrics)

        // A 202 promises the cancel is on disk, which it cannot be yet: the answer is 503, but the cancel is done
        // in memory and its state waits for the store.
        let cancel = harness.call(.cancelJob, id: id)
        XCTAssertEqual(cancel.status, 503, cancel.text)
        XCTAssertEqual(cancel.errorCode, "storage_unavailable")
        XCTAssertEqual(harness.settled(id)?["state"]?.stringValue, "cancelled")
        XCTAssertNotEqual(try storedState(other, id), "cancelled", "nothing could be written yet")
        try other.execute("ROLLBACK")

        // Recovery without a restart: the writer's retry commits everything it held, the cancel with it, and
        // health comes back.
        XCTAssertTrue(
            harness.engine.store.waitForHealth(milliseconds: 30_000) { !$0.degraded && $0.pendingChanges == 0 },
            "the store never recovered: \(harness.engine.store.health)")
        let healthy = harness.call(.health)
        XCTAssertEqual(healthy.status, 200, healthy.text)
        XCTAssertEqual(try storedState(other, id), "cancelled")
        XCTAssertTrue(harness.call(.metrics).text.contains("\njobserver_store_degraded 0\n"))
        XCTAssertEqual(harness.call(.submitJob, body: fetchJob(upstream.url("/json"))).status, 201)
    }

    private func storedState(_ db: SQLiteConnection, _ id: String) throws -> String? {
        let statement = try db.prepare("SELECT state FROM jobs WHERE id = ?1")
        defer { statement.reset() }
        statement.bind(1, id)
        return try statement.step() ? statement.string(0) : nil
    }
}
