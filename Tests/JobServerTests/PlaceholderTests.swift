import XCTest

final class JobServerPlaceholderTests: XCTestCase {
    func testNothingYet() {}
}
