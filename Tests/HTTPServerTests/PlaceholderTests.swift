import XCTest
@testable import HTTPServer

final class PlaceholderTests: XCTestCase {
    func testModuleLoads() { _ = HTTPServerModule.self }
}
