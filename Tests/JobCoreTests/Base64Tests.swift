import Foundation
import XCTest

@testable import JobCore

/// The base64 of `bytes`/binary bodies, against Foundation's, at every padding.
final class Base64Tests: XCTestCase {
    func testEncodingMatchesFoundationAtEveryLength() {
        var generator = SystemRandomNumberGenerator()
        for length in 0...70 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            XCTAssertEqual(Base64.encode(bytes), Data(bytes).base64EncodedString(), "length \(length)")
        }
        let big = [UInt8](repeating: 0xab, count: 3 * 1024 * 1024 + 2)
        XCTAssertEqual(Base64.encode(big), Data(big).base64EncodedString())
    }
}
