import JobCore
import TestSupport
import XCTest

@testable import JobServer

/// Every `AppRouteTests` test with the harness's store on PostgreSQL: a throwaway cluster for the class, a fresh
/// database per harness (the same one for a harness made again on the same path). When PostgreSQL cannot start,
/// every test fails with the reason.
final class PostgresAppRouteTests: AppRouteTests {
    // nonisolated(unsafe): written only by the class `setUp`, read by the tests after it, which XCTest runs one after
    // another on one thread.
    nonisolated(unsafe) static var startFailure: Error?

    override class func setUp() {
        super.setUp()
        do {
            HarnessPostgres.current = HarnessPostgres(cluster: try PostgresCluster.start())
        } catch {
            startFailure = error
        }
    }

    override class func tearDown() {
        HarnessPostgres.current?.cluster.stop()
        HarnessPostgres.current = nil
        super.tearDown()
    }

    override func setUpWithError() throws {
        if let failure = Self.startFailure { throw failure }
        try super.setUpWithError()
    }

    /// Declared here so that Linux test discovery lists the inherited tests of this class.
    func testTheHarnessRunsOnPostgres() throws {
        XCTAssertTrue(HarnessPostgres.current != nil)
    }
}
