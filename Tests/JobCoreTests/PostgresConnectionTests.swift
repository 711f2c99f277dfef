import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// libpq through `PostgresConnection`, against a real throwaway PostgreSQL cluster.
final class PostgresConnectionTests: XCTestCase {
    // nonisolated(unsafe): written only by the class `setUp` and `tearDown`, read by the tests between them, which
    // XCTest runs one after another on one thread.
    nonisolated(unsafe) static var cluster: PostgresCluster?
    nonisolated(unsafe) static var startFailure: Error?

    override class func setUp() {
        do { cluster = try PostgresCluster.start() } catch { startFailure = error }
    }

    override class func tearDown() {
        cluster?.stop()
        cluster = nil
    }

    /// The URL of a new, empty database.
    private func database() throws -> String {
        // Not skipped: a machine where PostgreSQL cannot start fails here, with the reason.
        if let failure = Self.startFailure { throw failure }
        return try XCTUnwrap(Self.cluster).freshDatabase()
    }

    private func connect() throws -> PostgresConnection { try PostgresConnection(url: try database()) }

    func testParametersRoundTripAsTextBytesAndNull() throws {
        let db = try connect()
        try db.execute("CREATE TABLE t (id bigint PRIMARY KEY, name text, data bytea)")
        let bytes: [UInt8] = [0, 1, 2, 0x7F, 0x80, 0xFF]
        let inserted = try db.query("INSERT INTO t VALUES ($1, $2, $3), ($4, $5, $6)",
                                    [.int(1), .text("ann \u{1F600} 'quoted'"), .bytes(bytes), .int(2), .null, .null])
        XCTAssertEqual(inserted.affected, 2)
        let rows = try db.query("SELECT id, name, data FROM t ORDER BY id")
        XCTAssertEqual(rows.columns, ["id", "name", "data"])
        XCTAssertEqual(rows.rows.count, 2)
        XCTAssertEqual(rows.value(0, "name"), "ann \u{1F600} 'quoted'")
        XCTAssertEqual(rows.value(0, "data").flatMap(PostgresRows.bytes(fromHex:)), bytes)
        XCTAssertNil(rows.value(1, "name"))
        XCTAssertNil(rows.value(1, "data"))
    }

    func testPreparedStatementsAreReusedAndTransactionsRollBack() throws {
        let db = try connect()
        try db.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        for i in 0..<5 { try db.run(prepared: "insert_t", "INSERT INTO t VALUES ($1)", [.int(i)]) }
        XCTAssertThrowsError(try db.transaction {
            try db.run(prepared: "insert_t", "INSERT INTO t VALUES ($1)", [.int(100)])
            try db.run(prepared: "insert_t", "INSERT INTO t VALUES ($1)", [.int(0)])  // duplicate
        }) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .constraint, "\(error)")
        }
        XCTAssertEqual(try db.query("SELECT count(*) AS n FROM t").value(0, "n"), "5", "the whole transaction rolled back")
        let committed = try db.transaction { try db.run(prepared: "insert_t", "INSERT INTO t VALUES ($1)", [.int(6)]).affected }
        XCTAssertEqual(committed, 1)
    }

    func testNotificationsArriveOnTheListeningConnection() throws {
        // NOTIFY reaches the listeners of the same database.
        let url = try database()
        let listener = try PostgresConnection(url: url)
        let sender = try PostgresConnection(url: url)
        try listener.listen("jobs_changed")
        XCTAssertEqual(try listener.notifications(timeoutMs: 0), [])
        try sender.query("SELECT pg_notify('jobs_changed', $1)", [.text("job-1")])
        var received: [PostgresNotification] = []
        let deadline = Date().addingTimeInterval(5)
        while received.isEmpty, Date() < deadline { received = try listener.notifications(timeoutMs: 200) }
        XCTAssertEqual(received.map(\.channel), ["jobs_changed"])
        XCTAssertEqual(received.first?.payload, "job-1")
        XCTAssertEqual(received.first?.senderPID, sender.backendPID)
        XCTAssertThrowsError(try listener.listen("bad; DROP TABLE x"))
    }

    func testErrorsHaveTheStoreKindOfTheirSQLState() throws {
        let db = try connect()
        XCTAssertThrowsError(try db.execute("SELEC 1")) { XCTAssertEqual(($0 as? StoreError)?.kind, .io) }
        XCTAssertEqual(PostgresConnection.kind(sqlState: "53100"), .full)
        XCTAssertEqual(PostgresConnection.kind(sqlState: "08006"), .unavailable)
        XCTAssertEqual(PostgresConnection.kind(sqlState: "40P01"), .busy)
        XCTAssertEqual(PostgresConnection.kind(sqlState: "23505"), .constraint)
        // The connection still works after an error.
        XCTAssertEqual(try db.query("SELECT 1 + 1 AS two").value(0, "two"), "2")
        // A server that terminates the connection: `unavailable`, and the next statement connects again.
        let pid = db.backendPID
        let admin = try PostgresConnection(url: try XCTUnwrap(Self.cluster?.url))
        try admin.query("SELECT pg_terminate_backend($1)", [.int(Int(pid))])
        XCTAssertThrowsError(try db.execute("SELECT 1")) { XCTAssertEqual(($0 as? StoreError)?.kind, .unavailable, "\($0)") }
        XCTAssertEqual(try db.query("SELECT 2 AS two").value(0, "two"), "2")
        XCTAssertNotEqual(db.backendPID, pid)
    }

    func testConnectingToNothingIsAnOpenErrorWithoutThePassword() throws {
        XCTAssertThrowsError(try PostgresConnection(url: "postgres://user:s3cret@127.0.0.1:1/db?connect_timeout=2")) { error in
            let store = error as? StoreError
            XCTAssertEqual(store?.kind, .open)
            XCTAssertFalse(store?.message.contains("s3cret") ?? true)
        }
    }
}
