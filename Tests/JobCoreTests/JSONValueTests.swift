import XCTest
import Foundation
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

    func testWritesEveryByteThatNeedsAnEscapeWhereverItStands() throws {
        let controls = (0..<0x20).map { String(UnicodeScalar(UInt8($0))) }
        for special in controls + ["\"", "\\"] {
            for text in [special, "ab" + special, special + "cd", "ab" + special + special + "cd", "é" + special + "😀"] {
                let written = JSONValue.string(text).text
                XCTAssertFalse(written.dropFirst().dropLast().unicodeScalars.contains { $0.value < 0x20 }, written)
                XCTAssertEqual(try JSONValue.parse(written), .string(text), written)
            }
        }
        XCTAssertEqual(JSONValue.string("a\u{01}\u{1f}\t\"b").text, #""a\u0001\u001f\t\"b""#)
        XCTAssertEqual(JSONValue.string("").text, #""""#)
        let long = String(repeating: "x", count: 100_000)
        XCTAssertEqual(JSONValue.string(long).text, "\"" + long + "\"")
    }

    /// `text` as a JSON string written a byte at a time: the reference the writer's word-wise scans are held to.
    private static func escapedOneByOne(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    /// A string found clean is written whole after one check whose reads depend on its length (sixteen bytes at a
    /// time and the last sixteen again, or the first and last eight, or four, or byte by byte under four): at every
    /// length up to 48 bytes, a byte to escape at every offset is escaped, and a string with none is written as it
    /// is, beside bytes of 0x7F and above and the neighbours of the escaped ones.
    func testEscapesAreFoundAtEveryOffsetOfStringsOfEveryLength() throws {
        let specials = ["\"", "\\", "\u{00}", "\u{01}", "\n", "\u{1f}"]
        for filler in ["x", "\u{7f}", " ", "!", "#", "]"] {
            for length in 0...48 {
                let plain = String(repeating: filler, count: length)
                XCTAssertEqual(JSONValue.string(plain).text, "\"" + plain + "\"", "\(length) of \(filler)")
                for offset in 0..<length {
                    for special in specials {
                        let text = String(repeating: filler, count: offset) + special
                            + String(repeating: filler, count: length - offset - 1)
                        XCTAssertEqual(
                            JSONValue.string(text).text, Self.escapedOneByOne(text),
                            "offset \(offset) of \(length) of \(filler)")
                    }
                }
            }
        }
        for length in 0...24 {
            let wide = String(repeating: "é", count: length)
            XCTAssertEqual(JSONValue.string(wide).text, "\"" + wide + "\"")
            XCTAssertEqual(JSONValue.string(wide + "\"").text, Self.escapedOneByOne(wide + "\""))
        }
    }

    /// The writer skips sixteen bytes, then eight, at a time where none needs an escape: a byte that does is escaped at
    /// every offset within and across those words, beside bytes of 0x80 and above, as a byte-at-a-time writer does it.
    func testEscapesAreFoundAtEveryOffsetOfTheWordWiseScan() throws {
        let specials = (0..<0x20).map { String(UnicodeScalar(UInt8($0))) } + ["\"", "\\"]
        for filler in ["x", "é", "\u{7f}", "😀", "!"] {
            for special in specials {
                for offset in 0..<40 {
                    let before = String(repeating: filler, count: offset)
                    let text = before + special + String(repeating: filler, count: 39 - offset)
                    XCTAssertEqual(JSONValue.string(text).text, Self.escapedOneByOne(text), "offset \(offset) of \(filler)")
                }
            }
            let plain = String(repeating: filler, count: 37)
            XCTAssertEqual(JSONValue.string(plain).text, Self.escapedOneByOne(plain))
        }
        // Bytes just beside the escaped ones (0x20, 0x21, 0x23, 0x5B, 0x5D) pass as they are.
        let neighbours = String(repeating: " !#[]", count: 8)
        XCTAssertEqual(JSONValue.string(neighbours).text, "\"" + neighbours + "\"")
    }

    /// An object of four or more scalar members written again from the same storage (a fetch result's `headers`,
    /// which results alike share) is a copy of its text written before: the same bytes as each entry written on its
    /// own, whatever room the first pass is given, so that the copy falls before, across or after where the bytes
    /// stop fitting, and whatever escapes the members need.
    func testAnObjectWrittenAgainFromTheSameStorageIsItsTextAgain() throws {
        let headers = JSONValue.object((0..<8).map { JSONMember("h\($0)", .string("v\"\($0)")) })
        let few = JSONValue.object([JSONMember("a", 1), JSONMember("b", .string("x")), JSONMember("c", nil)])
        let nested = JSONValue.object((0..<5).map { JSONMember("n\($0)", .array([.string("y")])) })
        for count in [1, 2, 3, 7] {
            let entries: [JSONValue] = (0..<count).map { k in
                .object([
                    JSONMember("status", .int(k)), JSONMember("headers", headers), JSONMember("few", few),
                    JSONMember("nested", nested), JSONMember("body", .string(String(repeating: "b\n", count: k * 5))),
                ])
            }
            let list = JSONValue.array(entries)
            // Written one by one, no entry shares a sink with another.
            let expected = "[" + entries.map(\.text).joined(separator: ",") + "]"
            XCTAssertEqual(list.text, expected)
            for room in stride(from: 0, through: expected.utf8.count + 8, by: 3) {
                let bytes = ByteSink.bytes(unescapedCount: room) { list.write(to: &$0) }
                XCTAssertEqual(String(decoding: bytes, as: UTF8.self), expected, "\(count) entries, room \(room)")
            }
        }
        // The same members in storage of their own are written anew, to the same text.
        let again = try JSONValue.parse(headers.text)
        XCTAssertEqual(JSONValue.array([headers, again, headers]).text, "[" + [headers.text, again.text, headers.text].joined(separator: ",") + "]")
    }

    /// `bytes` writes into a buffer sized for the text without escapes and a margin: a text whose escapes outgrow it,
    /// by one byte or by many, at any depth, is written again at the size the first pass counted, whole.
    func testTextWhoseEscapesOutgrowTheFirstBufferIsWrittenWhole() throws {
        for count in 0...120 {
            for special in ["\"", "\u{01}"] {
                let text = String(repeating: special, count: count)
                let escaped = String(repeating: special == "\"" ? #"\""# : #"\u0001"#, count: count)
                let value = JSONValue.array([.object(["k" + text: .string(text)]), .string("x")])
                let expected = #"[{"k"# + escaped + #"":""# + escaped + #""},"x"]"#
                XCTAssertEqual(value.text, expected, "\(count) of \(special.unicodeScalars.first?.value ?? 0)")
                XCTAssertEqual(value.bytes.count, expected.utf8.count)
                // Appended after what is there, whatever its escapes need.
                var out = Array("head,".utf8)
                value.append(to: &out)
                XCTAssertEqual(String(decoding: out, as: UTF8.self), "head," + expected)
            }
        }
    }

    /// `bytes(expectedCount:)` writes the same text as `bytes` whatever room it is told to expect: less than the
    /// text needs (written again at its length), exactly it, or more.
    func testBytesWithAnExpectedCountAreTheBytesWhateverTheCount() throws {
        let values: [JSONValue] = [
            .null, .string(""), .string(String(repeating: "\"", count: 300)),
            try JSONValue.parse(#"{"status":200,"headers":{"a":"b"},"body":{"data":"xyz\n"},"url":"http://h/é"}"#),
            .array((0..<50).map { .string(String(repeating: "\u{01}", count: $0)) }),
        ]
        for value in values {
            let expected = value.bytes
            for count in [0, 1, expected.count - 1, expected.count, expected.count + 1, 10 * expected.count, -5] {
                XCTAssertEqual(value.bytes(expectedCount: count), expected, "\(count) for \(value.text.prefix(40))")
            }
        }
    }

    func testUnescapedByteCountIsTheLengthWhenNothingIsEscapedAndALowerBoundOtherwise() throws {
        let plain = try JSONValue.parse(#"{"a":[1,true,false,null,"xyz",{"é":"😀"}],"bb":[],"c":{}}"#)
        XCTAssertEqual(plain.unescapedByteCount, plain.bytes.count)
        let escaped = JSONValue.array([.string("a\"b\n"), .object(["k\\": .string("\u{01}")])])
        XCTAssertLessThan(escaped.unescapedByteCount, escaped.bytes.count)
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

    func testErrorPointerCountsOnlyTheArraysOwnElements() {
        let cases: [(String, String)] = [
            (#"[[1,2],[3,x]]"#, "/1/1"),
            (#"{"a":[1,{"b":[0,[7,8],tru]}]}"#, "/a/1/b/2"),
            (#"[{"k":[1,2,3]},{"k":[4,5,6,"\q"]}]"#, "/1/k/3"),
            (#"{"a":1,"b":{"c":[]},"d":[[],[[]],?]}"#, "/d/2"),
        ]
        for (text, pointer) in cases {
            XCTAssertThrowsError(try JSONValue.parse(text), text) { error in
                XCTAssertEqual((error as? JSONParseError)?.pointer, pointer, text)
            }
        }
    }

    // MARK: - Large inputs

    func testFortyThousandKeysKeepTheirOrderAndTextExactly() throws {
        let count = 40_000
        var text = "{"
        for i in 0..<count {
            if i > 0 { text += "," }
            // Keys in an order no sort would give, so that only the input's order passes.
            text += #""k\#((i * 7919) % count)":\#(i)"#
        }
        text += "}"
        let value = try JSONValue.parse(text)
        guard let members = value.objectValue else { return XCTFail("not an object") }
        XCTAssertEqual(members.count, count)
        for i in [0, 1, 2, 19_999, 39_999] {
            XCTAssertEqual(members[i].key, "k\((i * 7919) % count)")
            XCTAssertEqual(members[i].value, .number(String(i)))
        }
        XCTAssertEqual(value.text, text)
    }

    func testDuplicateKeysAreKeptInOrderAndTheLastOneIsRead() throws {
        var text = "{"
        for i in 0..<20_000 { text += #""a":\#(i),"b\#(i)":0,"# }
        text += #""a":"last"}"#
        let value = try JSONValue.parse(text)
        XCTAssertEqual(value.objectValue?.count, 40_001)
        XCTAssertEqual(value.objectValue?.filter { $0.key == "a" }.count, 20_001)
        XCTAssertEqual(value["a"], "last")
        XCTAssertEqual(value.text, text)
    }

    func testLongArraysOfEveryScalarKind() throws {
        let count = 50_000
        let items = (0..<count).map { i -> String in
            switch i % 5 {
            case 0: return "-\(i).5e-3"
            case 1: return #""s\#(i)\n\u00e9""#
            case 2: return "true"
            case 3: return "null"
            default: return #"{"i":\#(i)}"#
            }
        }
        let text = "[" + items.joined(separator: ",") + "]"
        let value = try JSONValue.parse(text)
        guard let elements = value.arrayValue else { return XCTFail("not an array") }
        XCTAssertEqual(elements.count, count)
        XCTAssertEqual(elements[49_995], .number("-49995.5e-3"))
        XCTAssertEqual(elements[49_996], .string("s49996\né"))
        XCTAssertEqual(elements[49_999], .object(["i": 49_999]))
        XCTAssertEqual(value.text, text.replacingOccurrences(of: "\\u00e9", with: "é"))
    }

    /// The parser reads a string sixteen bytes, then eight, at a time while none is a quote, a backslash or a control
    /// byte: the string's end, an escape, a raw control byte (refused) and a byte that is not UTF-8 (refused) are each
    /// found at every offset within and across those words, beside bytes of 0x80 and above.
    func testStringEndsEscapesAndRefusedBytesAreFoundAtEveryOffsetOfTheWordWiseScan() throws {
        let specials = (0..<0x20).map { String(UnicodeScalar(UInt8($0))) } + ["\"", "\\", "/"]
        for filler in ["x", "é", "\u{7f}", "😀"] {
            for length in 0..<40 {
                let text = String(repeating: filler, count: length)
                XCTAssertEqual(try JSONValue.parse(#"[""# + text + #"","y"]"#), .array([.string(text), .string("y")]))
            }
            for offset in 0..<40 {
                let before = String(repeating: filler, count: offset)
                let after = String(repeating: filler, count: 39 - offset)
                for special in specials {
                    let text = before + special + after
                    XCTAssertEqual(try JSONValue.parse(JSONValue.string(text).text), .string(text), "offset \(offset)")
                }
                XCTAssertEqual(try JSONValue.parse(#"""# + before + #"\/"# + after + #"""#), .string(before + "/" + after))
                XCTAssertThrowsError(try JSONValue.parse(#"""# + before + "\u{01}" + after + #"""#), "offset \(offset)")
                var notUTF8 = Array(("\"" + before).utf8)
                notUTF8.append(0xFF)
                notUTF8 += Array((after + "\"").utf8)
                XCTAssertThrowsError(try JSONValue.parse(notUTF8), "offset \(offset) of \(filler)")
            }
        }
    }

    func testLongStringWithAndWithoutEscapes() throws {
        let plain = String(repeating: "abcdefgh", count: 128 * 1024)
        XCTAssertEqual(try JSONValue.parse("\"" + plain + "\""), .string(plain))
        let escaped = String(repeating: #"a\"\\\u00e9\ud83d\ude00"#, count: 50_000)
        let expected = String(repeating: "a\"\\é😀", count: 50_000)
        XCTAssertEqual(try JSONValue.parse("\"" + escaped + "\""), .string(expected))
    }

    func testNestingExactlyAtTheLimitIsAcceptedAndOneMoreRefused() throws {
        let depth = 3_000
        var value = try JSONValue.parse(
            String(repeating: #"{"a":["#, count: depth / 2) + "1" + String(repeating: "]}", count: depth / 2),
            maxDepth: depth)
        var levels = 0
        while case .object(let members) = value, let inner = members.first?.value.arrayValue?.first {
            levels += 2
            value = inner  // one layer at a time, so no deinit recurses through the whole depth
        }
        XCTAssertEqual(levels, depth)
        XCTAssertEqual(value, 1)
        let tooDeep = String(repeating: "[", count: depth + 1) + String(repeating: "]", count: depth + 1)
        XCTAssertThrowsError(try JSONValue.parse(tooDeep, maxDepth: depth)) { error in
            XCTAssertEqual((error as? JSONParseError)?.isTooDeep, true)
        }
    }

    func testNodeErrorJSONRoundTrip() {
        let e = NodeError(.allFailed, "every child failed", node: "root", errors: [NodeError(.httpStatus, "503", node: "root.0", status: 503)])
        XCTAssertEqual(NodeError(json: e.json), e)
        XCTAssertEqual(e.errors?.first?.json.text, #"{"kind":"http_status","message":"503","node":"root.0","status":503}"#)
    }
}
