import XCTest

@testable import JobCore

// The engine tests again, each on a fresh database of a throwaway PostgreSQL cluster (EngineTestCase.makeStore):
// the engine must behave the same on either store, restarts, repairs and damaged rows included. When PostgreSQL
// cannot start, every test of these classes fails with the reason.
//
// Each class declares one test of its own: Linux test discovery lists the inherited tests only of a class that
// declares some.

extension EngineTestCase {
    func checkTheStoreIsPostgres() throws {
        let store = try makeStore(dbName: "check.sqlite")
        defer { store.close() }
        XCTAssertTrue(store is PostgresJobStore)
    }
}

final class PostgresEngineTests: EngineTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}

final class PostgresMapEngineTests: MapEngineTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}

final class PostgresScheduleTests: ScheduleTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}

final class PostgresPaginateEngineTests: PaginateEngineTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}

final class PostgresEngineEventsTests: EngineEventsTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}

final class PostgresGraphRestartLimitsTests: GraphRestartLimitsTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}
