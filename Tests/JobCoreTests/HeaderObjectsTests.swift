import XCTest
@testable import JobCore

/// Fetch results share their `headers` objects where they agree, and each is still the object of its own fields.
final class HeaderObjectsTests: XCTestCase {
    typealias Fields = [(name: String, value: String)]

    static let first: Fields = [
        ("server", "nginx/1.22.1"), ("date", "Sun, 06 Dec 2026 12:28:27 GMT"), ("content-type", "application/json"),
        ("last-modified", "Sun, 06 Dec 2026 12:28:14 GMT"),
    ]

    /// Where a string's bytes are; the same for two strings that share their storage (these are all longer than a
    /// string kept inline).
    private func storage(_ value: JSONValue?) -> UnsafeRawPointer? {
        guard case .string(let s)? = value else { return nil }
        return s.utf8.withContiguousStorageIfAvailable { UnsafeRawPointer($0.baseAddress) } ?? nil
    }

    /// Each row's fields come after `first`'s; the object is theirs whatever was shared.
    func testEachObjectIsItsFieldsWhateverItShares() {
        var changedDate = Self.first
        changedDate[1].value = "Sun, 06 Dec 2026 12:28:28 GMT"
        let rows: [(what: String, fields: Fields, sharedDate: Bool, sharedType: Bool)] = [
            ("the same fields", Self.first, true, true),
            ("another date", changedDate, false, true),
            ("one field more", Self.first + [("etag", "\"6b1554de-15\"")], true, true),
            ("one field fewer", Array(Self.first.dropLast()), true, true),
            ("the fields in another order", Self.first.reversed(), false, false),
            ("no field", [], false, false),
        ]
        for row in rows {
            let objects = HeaderObjects()
            let before = objects.object(Self.first.map { ($0.name, String(decoding: Array($0.value.utf8), as: UTF8.self)) })
            let object = objects.object(row.fields.map { ($0.name, String(decoding: Array($0.value.utf8), as: UTF8.self)) })
            XCTAssertEqual(object, HeaderObjects.object(row.fields), row.what)
            XCTAssertEqual(storage(object["date"]) != nil && storage(object["date"]) == storage(before["date"]), row.sharedDate, row.what)
            XCTAssertEqual(
                storage(object["content-type"]) != nil && storage(object["content-type"]) == storage(before["content-type"]),
                row.sharedType, row.what)
        }
    }
}
