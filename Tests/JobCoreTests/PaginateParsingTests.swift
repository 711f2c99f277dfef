import XCTest

@testable import JobCore

/// API.md §7.2 at submit: the `paginate` object, each refusal a 422 issue at its field; and the URL work of a walk.
final class PaginateParsingTests: XCTestCase {
    private let url = #""type": "fetch", "url": "http://h/items""#

    private func spec(_ paginate: String, _ extra: String = "", file: StaticString = #filePath, line: UInt = #line)
        throws -> PaginateSpec?
    {
        try acceptedSpec(#"{"graph": {\#(url), \#(extra)"paginate": \#(paginate)}}"#, file: file, line: line)
            .graph.root.dataflow?.paginate
    }

    /// The issues of a refused body, as (pointer, message).
    private func refusal(_ graphFields: String, file: StaticString = #filePath, line: UInt = #line) -> [ValidationIssue] {
        refusalIssues(#"{"graph": {\#(graphFields)}}"#, file: file, line: line)
    }

    func testEveryNextKindWithItsDefaults() throws {
        XCTAssertEqual(try spec(#"{"next": "link"}"#), PaginateSpec(next: .link))
        let items = try XCTUnwrap(JSONPointerPath("/body/items"))
        let next = try XCTUnwrap(JSONPointerPath("/body/next"))
        XCTAssertEqual(
            try spec(#"{"next": {"url": "/body/next"}, "items": "/body/items", "max_pages": 1000, "same_origin": false}"#),
            PaginateSpec(next: .url(next), items: items, maxPages: 1000, sameOrigin: false))
        XCTAssertEqual(try spec(#"{"next": {"cursor": "/body/next"}}"#), PaginateSpec(next: .cursor(next, param: "cursor")))
        XCTAssertEqual(
            try spec(#"{"next": {"cursor": "/body/next", "param": "after"}, "max_pages": 1}"#),
            PaginateSpec(next: .cursor(next, param: "after"), maxPages: 1))
        XCTAssertEqual(
            try spec(#"{"next": {"page": "p"}, "items": "/body/items"}"#),
            PaginateSpec(next: .page(param: "p", start: 1), items: items))
        XCTAssertEqual(
            try spec(#"{"next": {"page": "p", "start": 0}, "items": "/body/items"}"#, #""method": "HEAD", "#),
            PaginateSpec(next: .page(param: "p", start: 0), items: items))
    }

    func testEachBadFieldIsRefusedAtItsPointer() {
        let rows: [(String, String, String)] = [
            (#""method": "POST", "paginate": {"next": "link"}"#, "/graph/paginate", "only for GET and HEAD"),
            (#""paginate": {"next": "link", "max_pages": 0}"#, "/graph/paginate/max_pages", "from 1 to 1000"),
            (#""paginate": {"next": "link", "max_pages": 1001}"#, "/graph/paginate/max_pages", "from 1 to 1000"),
            (#""paginate": {"next": "link", "max_pages": 2.5}"#, "/graph/paginate/max_pages", "from 1 to 1000"),
            (#""paginate": {"next": "link", "items": "body"}"#, "/graph/paginate/items", "JSON Pointer"),
            (#""paginate": {"next": "link", "items": "/a~2"}"#, "/graph/paginate/items", "JSON Pointer"),
            (#""paginate": {"next": {"url": 3}}"#, "/graph/paginate/next/url", "JSON Pointer"),
            (#""paginate": {"next": {"cursor": "x"}}"#, "/graph/paginate/next/cursor", "JSON Pointer"),
            (#""paginate": {"next": {"cursor": "/c", "param": ""}}"#, "/graph/paginate/next/param", "parameter name"),
            (#""paginate": {"next": {"cursor": "/c", "start": 2}}"#, "/graph/paginate/next/start", "unknown field"),
            (#""paginate": {"next": {"page": "", "start": 1}, "items": "/b"}"#, "/graph/paginate/next/page", "parameter name"),
            (#""paginate": {"next": {"page": "p", "start": -1}, "items": "/b"}"#, "/graph/paginate/next/start", "from 0"),
            (#""paginate": {"next": {"page": "p"}}"#, "/graph/paginate/next", "needs items"),
            (#""paginate": {"next": "offset"}"#, "/graph/paginate/next", "unknown next kind"),
            (#""paginate": {"next": {"offset": "/o"}}"#, "/graph/paginate/next", "unknown next kind"),
            (#""paginate": {"next": {"url": "/u", "page": "p"}}"#, "/graph/paginate/next", "exactly one"),
            (#""paginate": {"next": 1}"#, "/graph/paginate/next", "not a number"),
            (#""paginate": {"next": "link", "same_origin": 1}"#, "/graph/paginate/same_origin", "boolean"),
            (#""paginate": {"next": "link", "pages": 2}"#, "/graph/paginate/pages", "unknown field"),
            (#""paginate": {"items": "/body"}"#, "/graph/paginate/next", "is required"),
            (#""paginate": ["link"]"#, "/graph/paginate", "must be an object"),
            (#""paginate": {"next": "link"}, "paginate": {"next": "link"}"#, "/graph/paginate", "duplicate field"),
        ]
        for (fields, pointer, fragment) in rows {
            let issues = refusal(url + ", " + fields)
            XCTAssertEqual(issues.first?.pointer, pointer, fields)
            XCTAssertTrue(issues.first?.message.contains(fragment) == true, "\(fields): \(issues)")
        }
        // Not a fetch field elsewhere.
        let list = refusal(#""type": "list", "children": [{\#(url)}], "paginate": {"next": "link"}"#)
        XCTAssertEqual(list.first?.pointer, "/graph/paginate")
    }

    func testEveryProblemOfOneObjectIsReported() {
        let issues = refusal(url + #", "method": "DELETE", "paginate": {"next": "x", "max_pages": 0, "same_origin": null}"#)
        XCTAssertEqual(
            issues.map(\.pointer),
            ["/graph/paginate", "/graph/paginate/next", "/graph/paginate/max_pages", "/graph/paginate/same_origin"])
    }

    // MARK: - URLs

    func testLinkHeaderNextPerRFC8288() {
        XCTAssertEqual(
            PageURLs.nextLink(#"<https://api.x/o?page=2>; rel="next", <https://api.x/o?page=9>; rel="last""#),
            "https://api.x/o?page=2")
        XCTAssertEqual(PageURLs.nextLink(#"<https://a/1>; rel="prev", <https://a/3>; rel=next"#), "https://a/3")
        XCTAssertEqual(PageURLs.nextLink(#"<https://a/x?a=1,2>; title="a, b"; rel="last next""#), "https://a/x?a=1,2")
        XCTAssertEqual(PageURLs.nextLink(#"</p/2>;REL="Next""#), "/p/2")
        XCTAssertNil(PageURLs.nextLink(#"<https://a/1>; rel="prev", <https://a/9>; rel="last""#))
        XCTAssertNil(PageURLs.nextLink(#"<https://a/1>; title="next""#))
        XCTAssertNil(PageURLs.nextLink(""))
        XCTAssertNil(PageURLs.nextLink("<unterminated; rel=next"))
    }

    func testRelativeReferencesOriginsAndQueryParameters() {
        XCTAssertEqual(PageURLs.resolve("/p?page=2", against: "http://h:8/a/b?x=1"), "http://h:8/p?page=2")
        XCTAssertEqual(PageURLs.resolve("?page=2", against: "http://h/a/b?x=1"), "http://h/a/b?page=2")
        XCTAssertEqual(PageURLs.resolve("c", against: "http://h/a/b"), "http://h/a/c")
        XCTAssertEqual(PageURLs.resolve("https://o/x", against: "http://h/a"), "https://o/x")

        XCTAssertEqual(PageURLs.origin("HTTP://Example.COM/a"), "http://example.com:80")
        XCTAssertEqual(PageURLs.origin("https://e.com:443/"), PageURLs.origin("https://e.com/x"))
        XCTAssertNotEqual(PageURLs.origin("http://127.0.0.1:80/"), PageURLs.origin("http://localhost/"))
        XCTAssertNotEqual(PageURLs.origin("http://h:8080/"), PageURLs.origin("http://h:8081/"))

        XCTAssertEqual(PageURLs.settingQuery("http://h/a", name: "page", value: "2"), "http://h/a?page=2")
        XCTAssertEqual(
            PageURLs.settingQuery("http://h/a?x=1&page=1&y=2&page=5#f", name: "page", value: "2"),
            "http://h/a?x=1&page=2&y=2#f")
        XCTAssertEqual(PageURLs.settingQuery("http://h/a?c=1", name: "c", value: "a b/+"), "http://h/a?c=a%20b%2F%2B")
    }
}
