import JobCore
import TestSupport
import XCTest

/// The upstream fixture itself: launch, stats, reset.
final class FetcherFixtureTests: XCTestCase {
    func testUpstreamStartsReportsStatsAndResets() throws {
        let upstream = try Upstream.start()
        defer { upstream.stop() }
        let (status, body) = try Upstream.request(port: upstream.port, method: "GET", path: "/count/fixture")
        XCTAssertEqual(status, 200)
        XCTAssertEqual(try JSONValue.parse(body)["count"]?.intValue, 1)
        let stats = try upstream.stats()
        XCTAssertEqual(stats["requests"]?.intValue, 1)
        XCTAssertEqual(stats["counters"]?["fixture"]?.intValue, 1)
        try upstream.resetStats()
        XCTAssertEqual(try upstream.stats()["requests"]?.intValue, 0)
        XCTAssertTrue(upstream.url("/json").hasPrefix("http://127.0.0.1:"))
    }
}
