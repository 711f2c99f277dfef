import XCTest

@testable import JobCore

/// A test class on a throwaway PostgreSQL cluster (started before its first test, stopped after its last), each
/// test on a fresh database (`databaseURL`). For the classes that are not a SQLite test class run again on
/// PostgreSQL (those subclass the SQLite class and start the cluster themselves).
class PostgresDatabaseTestCase: XCTestCase {
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

    override func tearDown() {
        databaseURL = ""
        super.tearDown()
    }

    /// The rows of `sql`, run on a connection of its own.
    func raw(_ sql: String) throws -> [[String?]] {
        let db = try PostgresConnection(url: databaseURL)
        defer { db.close() }
        return try db.execute(sql).rows
    }
}
