import XCTest
@testable import JobCore

final class JSONValueTests: XCTestCase {
    func testRoundTripKeepsOrderAndNumberText() throws {
        let text = #"{"b":1,"a":[true,false,null,1.50,-0,2e10],"s":"x\"y\\z\n\u00e9\ud83d\ude00"}"#
        let value = try JSONValue.parse(text)
        XCTAssertEqual(value["b"], .number("1"))
        XCTAssertEqual(value["a"]?.arrayValue?[3], .number("1.50"))
        XCTAssertEqual(value["s"]?.stringValue, "x\"y\\z\né😀")
        XCTAssertEqual(try JSONValue.parse(value.text), value)
        XCTAssertEqual(value.text, #"{"b":1,"a":[true,false,null,1.50,-0,2e10],"s":"x\"y\\z\n\#u{e9}😀"}"#)
    }

    func testRefusesMalformedInput() {
        let bad = ["", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "tru", "\"\u{01}\"", "[1] x", "{\"a\":1,}",
                   "\"\\ud800\"", "\"\\x\"", "nul", "[", "{\"a\":}", "1e", "+1"]
        for text in bad {
            XCTAssertThrowsError(try JSONValue.parse(text), "accepted \(text)")
        }
    }

    func testRefusesInvalidUTF8() {
        XCTAssertThrowsError(try JSONValue.parse([0x22, 0xFF, 0x22]))
    }

    func testDeepNestingIsRefusedWithoutRecursion() {
        let depth = 100_000
        let text = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
        XCTAssertThrowsError(try JSONValue.parse(text, maxDepth: 512)) { error in
            guard let e = error as? JSONParseError else { return XCTFail("\(error)") }
            XCTAssertTrue(e.isTooDeep)
            XCTAssertEqual(e.pointer.split(separator: "/").count, 512)
        }
    }

    func testErrorPointerNamesTheValueBeingRead() {
        XCTAssertThrowsError(try JSONValue.parse(#"{"graph":{"children":[{"a":1},{"url":tru}]}}"#)) { error in
            XCTAssertEqual((error as? JSONParseError)?.pointer, "/graph/children/1/url")
        }
    }

    func testNodeErrorJSONRoundTrip() {
        let e = NodeError(.allFailed, "every child failed", node: "root", errors: [NodeError(.httpStatus, "503", node: "root.0", status: 503)])
        XCTAssertEqual(NodeError(json: e.json), e)
        XCTAssertEqual(e.errors?.first?.json.text, #"{"kind":"http_status","message":"503","node":"root.0","status":503}"#)
    }
}
