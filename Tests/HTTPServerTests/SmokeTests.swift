import XCTest
@testable import HTTPServer

final class SmokeTests: XCTestCase {
    func testServerStartsAndStopsOnAnyPort() throws {
        var configuration = HTTPServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        let server = HTTPServer(configuration: configuration, router: Router())
        let port = try server.start()
        XCTAssertGreaterThan(port, 0)
        XCTAssertTrue(server.shutdown(gracePeriodSeconds: 1))
    }
}
