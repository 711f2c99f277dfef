import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// One throwaway cluster per test class, started by the class and stopped after it; a fresh database per test.
/// When PostgreSQL cannot start, every test of the class fails with the reason (never skipped).
final class PostgresTestCluster: @unchecked Sendable {
    // @unchecked: set once in a class `setUp` and read by that class's tests, which XCTest runs one at a time.
    var cluster: PostgresCluster?
    var startFailure: Error?

    func start() {
        startFailure = nil
        do { cluster = try PostgresCluster.start() } catch { startFailure = error }
    }

    /// A cluster started, for a test class that runs on PostgreSQL (`wanted`); nil for the others.
    static func started(if wanted: Bool) -> PostgresTestCluster? {
        guard wanted else { return nil }
        let cluster = PostgresTestCluster()
        cluster.start()
        return cluster
    }

    func stop() {
        cluster?.stop()
        cluster = nil
    }

    /// The URL of a new, empty database, or the reason PostgreSQL did not start.
    func freshDatabase() throws -> String {
        if let startFailure { throw startFailure }
        guard let cluster else { throw StoreError(.open, "the PostgreSQL cluster was not started") }
        return try cluster.freshDatabase()
    }
}

/// Every `StoreTests` test on a `PostgresJobStore`. The few that test SQLite's file are replaced by their
/// PostgreSQL counterpart, or by nothing where there is none (each says why).
final class PostgresStoreTests: StoreTests, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    override class var usesPostgres: Bool { true }

    override func assertSchemaIsCurrent() throws {
        let raw = try PostgresConnection(url: databaseURL)
        defer { raw.close() }
        XCTAssertEqual(try raw.execute("SELECT version FROM jobserver_schema").rows, [[String(PostgresSchema.currentVersion)]])
    }

    override func testFileFromANewerVersionIsRefused() throws {
        try makeStore().close()
        let raw = try PostgresConnection(url: databaseURL)
        try raw.query("UPDATE jobserver_schema SET version = $1", [.int(PostgresSchema.currentVersion + 1)])
        raw.close()
        XCTAssertThrowsError(try makeStore()) { XCTAssertEqual(($0 as? StoreError)?.kind, .migrate) }
    }

    /// PostgreSQL's counterpart of a file that is no database: a server that is not there.
    override func testNotADatabaseIsRefused() throws {
        guard let slash = databaseURL.lastIndex(of: "/") else { return XCTFail("odd URL \(databaseURL)") }
        // Port 1 on loopback: nothing listens there.
        let unreachable = "postgres://jobserver@127.0.0.1:1" + databaseURL[slash...]
        XCTAssertThrowsError(try PostgresJobStore(url: unreachable)) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .open)
            XCTAssertTrue("\(error)".contains("cannot connect"), "\(error)")
        }
    }

    /// As with a SQLite file, a second store on the database sees the first one's jobs while it is open (several
    /// servers share one database through leases: `PostgresLeaseTests`).
    override func testCreatedJobIsVisibleToAnotherStoreOnTheSameFile() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 1)
        let second = try makeStore()
        defer { second.close() }
        XCTAssertEqual(try second.job(id: jobID(1))?.name, "job 1")
    }

    /// SQLite-only: PostgreSQL keeps a job's request in its row (an update does not copy an unchanged large value).
    override func testARequestStoredInItsJobRowBeforeVersion9IsStillReadAndDeletedWithIt() {}

    /// SQLite-only: a SQLite store needs a file path; a PostgreSQL store is given a URL.
    override func testInMemoryPathIsRefused() {}

    /// As in SQLite, a read sees the last commit while another connection holds uncommitted changes.
    override func testReadsDoNotWaitForAWriter() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 1)
        let other = try PostgresConnection(url: databaseURL)
        defer { other.close() }
        try other.execute("BEGIN; UPDATE jobs SET name = 'uncommitted'")
        XCTAssertEqual(try store.job(id: jobID(1))?.name, "job 1")
        XCTAssertEqual(try store.listJobs(state: nil, limit: 5, cursor: nil).jobs.count, 1)
        try other.execute("ROLLBACK")
    }
}

/// `StoreFailureTests` on a `PostgresJobStore`.
final class PostgresStoreFailureTests: StoreFailureTests, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    override class var usesPostgres: Bool { true }

    /// The server goes away under the store: writes fail as a resource failure (kept, retried, degraded) and the
    /// kept change commits once the server is back — here, once the connection the writer lost is opened again.
    override func testWritesFailWhileAnotherProcessHoldsTheLockAndRecoverAfter() throws {
        let store = try makeStore()
        defer { store.close() }
        var job = try create(store, 1)
        // Ends every other connection to this database, the writer's among them: its next write meets a closed
        // connection (class 57P01 / 08), which libpq's reset then repairs.
        let admin = try PostgresConnection(url: databaseURL)
        defer { admin.close() }
        try admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        job.version = 2
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        // The first write after the cut fails or is already retried on a new connection; either way it commits.
        try store.waitUntilCommitted()
        XCTAssertEqual(try store.job(id: job.id)?.version, 2)
        XCTAssertFalse(store.health.degraded)
        try create(store, 2)
        XCTAssertNotNil(try store.job(id: jobID(2)))
    }
}

/// `StoreDurabilityTests` on PostgreSQL: a child process writing to a `PostgresJobStore` is killed with SIGKILL;
/// every job it was answered for and every change a flush confirmed is in the database.
final class PostgresStoreDurabilityTests: StoreDurabilityTests, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    override class var usesPostgres: Bool { true }

    override func childStoreLocation() throws -> String { databaseURL }

    /// Declared here so that Linux test discovery lists the inherited tests of this class.
    func testTheStoreIsPostgres() throws {
        let store = try makeStore()
        defer { store.close() }
        XCTAssertTrue(store is PostgresJobStore)
    }
}
