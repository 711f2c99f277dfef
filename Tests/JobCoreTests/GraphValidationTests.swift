import XCTest
@testable import JobCore

final class GraphValidationTests: XCTestCase {
    /// A child's default id is its parent's, a dot and its position, whatever their lengths.
    func testChildIDsAreTheParentsADotAndThePosition() {
        for parent in ["root", "a", "root.1.22", String(repeating: "p", count: 64)] {
            for position in [0, 1, 9, 10, 99, 100, 12_345, 99_999, 100_000, 9_999_999] {
                XCTAssertEqual(JobGraph.childID(parent, position), parent + "." + String(position))
            }
        }
    }

    private static let leaf = #"{"type":"fetch","url":"http://api.local/x"}"#

    // MARK: - The table of bad graphs

    func testEachBadGraphIsRefusedWithThePointerOfItsFirstProblem() {
        let longURL = "http://a/" + String(repeating: "x", count: 8192)
        let fetch = #""type":"fetch","url":"http://a/""#
        // (graph, pointer of the first issue, fragment of its message)
        let table: [(String, String, String)] = [
            (#"{"type":"fetch"}"#, "/graph/url", "is required"),
            (#"{"url":"http://a/"}"#, "/graph/type", "is required"),
            (#"{"type":"fetcher","url":"http://a/"}"#, "/graph/type", "must be one of fetch, list, sequence"),
            (#"{"type":1}"#, "/graph/type", "must be one of fetch, list, sequence"),
            (#"[]"#, "/graph", "must be an object"),
            (#""fetch""#, "/graph", "must be an object"),
            (#"{"type":"fetch","url":"ftp://a/b"}"#, "/graph/url", "scheme must be http or https"),
            (#"{"type":"fetch","url":"file:///etc/passwd"}"#, "/graph/url", "scheme must be http or https"),
            (#"{"type":"fetch","url":"gopher://a/"}"#, "/graph/url", "scheme must be http or https"),
            (#"{"type":"fetch","url":"/relative/path"}"#, "/graph/url", "absolute"),
            (#"{"type":"fetch","url":"http:/a"}"#, "/graph/url", "absolute"),
            (#"{"type":"fetch","url":"http://"}"#, "/graph/url", "must have a host"),
            (#"{"type":"fetch","url":"http://:80/"}"#, "/graph/url", "must have a host"),
            (#"{"type":"fetch","url":"http://a b/"}"#, "/graph/url", "white space"),
            (#"{"type":"fetch","url":"http://a/\u0000"}"#, "/graph/url", "control characters"),
            (#"{"type":"fetch","url":"http://a:99999/"}"#, "/graph/url", "port"),
            (#"{"type":"fetch","url":5}"#, "/graph/url", "must be a string"),
            (#"{"type":"fetch","url":"\#(longURL)"}"#, "/graph/url", "at most 8192"),
            (#"{\#(fetch),"method":"get"}"#, "/graph/method", "must be one of GET, HEAD"),
            (#"{\#(fetch),"method":"TRACE"}"#, "/graph/method", "must be one of GET, HEAD"),
            (#"{\#(fetch),"headers":[]}"#, "/graph/headers", "must be an object"),
            (#"{\#(fetch),"headers":{"Bad Name":"x"}}"#, "/graph/headers/Bad Name", "not a valid HTTP header name"),
            (#"{\#(fetch),"headers":{"a/b~c":"x"}}"#, "/graph/headers/a~1b~0c", "not a valid HTTP header name"),
            (#"{\#(fetch),"headers":{"X-A":1}}"#, "/graph/headers/X-A", "must be a string"),
            (#"{\#(fetch),"headers":{"X-A":"a\r\nB: c"}}"#, "/graph/headers/X-A", "CR, LF or NUL"),
            (#"{\#(fetch),"headers":{"Content-Length":"5"}}"#, "/graph/headers/Content-Length", "leave it out"),
            (#"{\#(fetch),"body":5}"#, "/graph/body", "must be a string"),
            (#"{\#(fetch),"body":"x","json":{}}"#, "/graph/json", "not both"),
            (#"{\#(fetch),"json":1,"body":"x"}"#, "/graph/body", "not both"),
            (#"{\#(fetch),"method":"HEAD","body":"x"}"#, "/graph/body", "HEAD"),
            (#"{\#(fetch),"expect":"xml"}"#, "/graph/expect", "must be one of json, text, bytes, auto"),
            (#"{\#(fetch),"accept_status":404}"#, "/graph/accept_status", "must be an array"),
            (#"{\#(fetch),"accept_status":[404,600]}"#, "/graph/accept_status/1", "must be an integer from 100 to 599"),
            (#"{\#(fetch),"retries":11}"#, "/graph/retries", "must be an integer from 0 to 10"),
            (#"{\#(fetch),"retries":1.5}"#, "/graph/retries", "must be an integer from 0 to 10"),
            (#"{\#(fetch),"retries":"1"}"#, "/graph/retries", "must be an integer from 0 to 10"),
            (#"{\#(fetch),"retries":true}"#, "/graph/retries", "must be an integer from 0 to 10"),
            (#"{\#(fetch),"retries":-1}"#, "/graph/retries", "must be an integer from 0 to 10"),
            (#"{\#(fetch),"retry_backoff_ms":60001}"#, "/graph/retry_backoff_ms", "from 0 to 60000"),
            (#"{\#(fetch),"idempotent":"yes"}"#, "/graph/idempotent", "must be a boolean"),
            (#"{\#(fetch),"max_bytes":10485761}"#, "/graph/max_bytes", "from 0 to 10485760"),
            (#"{\#(fetch),"follow_redirects":1}"#, "/graph/follow_redirects", "must be a boolean"),
            (#"{\#(fetch),"children":[]}"#, "/graph/children", "unknown field"),
            (#"{"type":"list","url":"http://a/","children":[\#(Self.leaf)]}"#, "/graph/url", "unknown field"),
            (#"{"type":"list","fire_on_first_eror":true,"children":[\#(Self.leaf)]}"#, "/graph/fire_on_first_eror",
             "did you mean fire_on_first_error"),
            (#"{"type":"sequence","fire_on_first_error":true,"children":[\#(Self.leaf)]}"#,
             "/graph/fire_on_first_error", "unknown field"),
            (#"{"type":"list"}"#, "/graph/children", "is required"),
            (#"{"type":"list","children":[]}"#, "/graph/children", "non-empty array"),
            (#"{"type":"sequence","children":{}}"#, "/graph/children", "non-empty array"),
            (#"{"type":"list","children":[1]}"#, "/graph/children/0", "must be an object"),
            (#"{"type":"list","cancel_remaining":null,"children":[\#(Self.leaf)]}"#, "/graph/cancel_remaining",
             "must be a boolean"),
            (#"{"type":"list","concurrency":0,"children":[\#(Self.leaf)]}"#, "/graph/concurrency", "from 1 to"),
            (#"{"type":"sequence","continue_on_error":"no","children":[\#(Self.leaf)]}"#, "/graph/continue_on_error",
             "must be a boolean"),
            (#"{\#(fetch),"timeout_ms":0}"#, "/graph/timeout_ms", "from 1 to 86400000"),
            (#"{\#(fetch),"timeout_ms":86400001}"#, "/graph/timeout_ms", "from 1 to 86400000"),
            (#"{\#(fetch),"timeout_ms":null}"#, "/graph/timeout_ms", "must be an integer"),
            (#"{\#(fetch),"id":""}"#, "/graph/id", "1 to 64 characters"),
            (#"{\#(fetch),"id":"a b"}"#, "/graph/id", "1 to 64 characters"),
            (#"{\#(fetch),"id":"\#(String(repeating: "a", count: 65))"}"#, "/graph/id", "1 to 64 characters"),
            (#"{\#(fetch),"id":5}"#, "/graph/id", "must be a string"),
            (#"{\#(fetch),"url":"http://b/"}"#, "/graph/url", "duplicate field"),
            (#"{"type":"list","children":[{"id":"x",\#(fetch)},{"id":"x",\#(fetch)}]}"#, "/graph/children/1/id",
             "duplicate id \"x\""),
            (#"{"type":"list","children":[{"id":"root",\#(fetch)}]}"#, "/graph/children/0/id", "duplicate id \"root\""),
            (#"{"type":"list","children":[{"id":"root.1",\#(fetch)},{\#(fetch)}]}"#, "/graph/children/1",
             "default id \"root.1\""),
            (#"{"type":"list","children":[{\#(fetch)},{"id":"root.0",\#(fetch)}]}"#, "/graph/children/1/id",
             "duplicate id \"root.0\""),
            (#"{"type":"list","children":[\#(Self.leaf),\#(Self.leaf),{"type":"fetch","url":"ftp://x/"}]}"#,
             "/graph/children/2/url", "scheme must be http or https"),
            (#"{"type":"sequence","children":[\#(Self.leaf),{"type":"list","children":[{"url":"http://a/"}]}]}"#,
             "/graph/children/1/children/0/type", "is required"),
        ]
        XCTAssertGreaterThanOrEqual(table.count, 40)
        for (row, (graph, pointer, fragment)) in table.enumerated() {
            checkFirstIssue(#"{"graph":\#(graph)}"#, row: row, pointer: pointer, fragment: fragment)
        }
    }

    /// Fails, naming the table row, unless `body` is refused and its first issue is at `pointer` with a message
    /// containing `fragment`. A body accepted, or refused for another reason, fails here too: no row is skipped.
    private func checkFirstIssue(
        _ body: String, row: Int, pointer: String, fragment: String, file: StaticString = #filePath, line: UInt = #line
    ) {
        let context = "row \(row), \(body.prefix(200))"
        let found: [ValidationIssue]
        do {
            let spec = try JobSpec.parse(try JSONValue.parse(body))
            return XCTFail("\(context): accepted with \(spec.graph.nodes.count) nodes", file: file, line: line)
        } catch let error as ValidationError {
            found = error.issues
        } catch {
            return XCTFail("\(context): refused by the parser, not the validator: \(error)", file: file, line: line)
        }
        guard let first = found.first else {
            return XCTFail("\(context): refused without an issue", file: file, line: line)
        }
        XCTAssertEqual(first.pointer, pointer, "\(context): \(found)", file: file, line: line)
        XCTAssertTrue(first.message.contains(fragment), "\(context): \(first.message)", file: file, line: line)
    }

    func testEachBadTopLevelIsRefusedWithItsPointer() {
        let graph = Self.leaf
        let bigMetadata = #"{"k":"\#(String(repeating: "x", count: 16377))"}"#
        let table: [(String, String, String)] = [
            ("[]", "", "must be a JSON object"),
            ("null", "", "must be a JSON object"),
            ("{}", "/graph", "is required"),
            (#"{"graph":\#(graph),"nme":"x"}"#, "/nme", "did you mean name"),
            (#"{"graph":\#(graph),"a~b/c":1}"#, "/a~0b~1c", "unknown field"),
            (#"{"graph":\#(graph),"name":5}"#, "/name", "must be a string"),
            (#"{"graph":\#(graph),"name":"\#(String(repeating: "é", count: 201))"}"#, "/name", "at most 200"),
            (#"{"graph":\#(graph),"deadline_ms":0}"#, "/deadline_ms", "from 1 to 86400000"),
            (#"{"graph":\#(graph),"deadline_ms":86400001}"#, "/deadline_ms", "from 1 to 86400000"),
            (#"{"graph":\#(graph),"deadline_ms":"60000"}"#, "/deadline_ms", "must be an integer"),
            (#"{"graph":\#(graph),"metadata":[]}"#, "/metadata", "must be an object"),
            (#"{"graph":\#(graph),"metadata":\#(bigMetadata)}"#, "/metadata", "16 KiB"),
            (#"{"graph":\#(graph),"graph":\#(graph)}"#, "/graph", "duplicate field"),
        ]
        for (row, (body, pointer, fragment)) in table.enumerated() {
            checkFirstIssue(body, row: row, pointer: pointer, fragment: fragment)
        }
    }

    /// Each fetch field is found by its name, and checked: given a value of a type no field but `json` takes, a
    /// fetch is refused at that field with the field's own message, not as an unknown field. No other name is found.
    func testEveryFetchFieldIsFoundByItsNameAndChecked() throws {
        for field in GraphValidator.FetchField.allCases {
            XCTAssertEqual(GraphValidator.FetchField.named(field.rawValue), field, field.rawValue)
            let url = field == .url ? "" : #""url":"http://api.local/x","#
            let body = #"{"graph":{"type":"fetch",\#(url)"\#(field.rawValue)":{"no":[]}}}"#
            if field == .json {
                XCTAssertEqual(try acceptedSpec(body).graph.nodes.first?.fetchRequest?.body, .json(.object([JSONMember("no", .array([]))])))
                continue
            }
            let found = refusalIssues(body)
            XCTAssertFalse(found.isEmpty, field.rawValue)
            XCTAssertTrue(found.allSatisfy { $0.pointer.hasPrefix("/graph/\(field.rawValue)") }, "\(field.rawValue): \(found)")
            XCTAssertFalse(found.contains { $0.message.contains("unknown field") }, "\(field.rawValue): \(found)")
        }
        XCTAssertEqual(GraphValidator.fetchFields.count, GraphValidator.FetchField.allCases.count)
        for name in ["URL", "urls", "", "children", "type", "accept-status"] {
            XCTAssertNil(GraphValidator.FetchField.named(name), name)
        }
    }

    func testNameOfExactly200CharactersIsAccepted() throws {
        let name = String(repeating: "é", count: 200)
        let spec = try acceptedSpec(#"{"name":"\#(name)","graph":\#(Self.leaf)}"#)
        XCTAssertEqual(spec.name, name)
    }

    // MARK: - Many problems at once

    func testEveryProblemIsReportedInDocumentOrder() {
        let body = #"""
            {"name": 7,
             "graph": {"type": "list", "children": [
                 {"type": "fetch", "url": "ftp://a/", "retries": 11},
                 {"url": "http://a/"},
                 {"type": "fetch", "url": "http://a/", "fire_on_first_result": true}
               ], "concurrency": 0, "fire_on_first_eror": true},
             "deadline_ms": 1.5,
             "extra": {}}
            """#
        let found = refusalIssues(body)
        XCTAssertEqual(
            found.map(\.pointer),
            [
                "/name",
                "/graph/children/0/url", "/graph/children/0/retries",
                "/graph/children/1/type",
                "/graph/children/2/fire_on_first_result",
                "/graph/concurrency", "/graph/fire_on_first_eror",
                "/deadline_ms", "/extra",
            ], "\(found)")
    }

    func testNodeWithInvalidTypeStillHasItsChildrenChecked() {
        let found = refusalIssues(#"{"graph":{"type":"lsit","bogus":1,"children":[{"type":"fetch"}]}}"#)
        XCTAssertEqual(found.map(\.pointer), ["/graph/type", "/graph/bogus", "/graph/children/0/url"], "\(found)")
    }

    func testIssuesStopAfterAHundredAndTheLastSaysSo() {
        let children = Array(repeating: #"{"type":"fetch","url":"ftp://x/"}"#, count: 150).joined(separator: ",")
        let found = refusalIssues(#"{"graph":{"type":"list","children":[\#(children)]}}"#)
        XCTAssertEqual(found.count, 101)
        XCTAssertEqual(found[99].pointer, "/graph/children/99/url")
        XCTAssertEqual(found[100].pointer, "/graph/children/100/url")
        XCTAssertTrue(found[100].message.contains("stopped after 100"), found[100].message)
    }

    func testIssueLocationReadsLikeAPath() {
        XCTAssertEqual(ValidationIssue(pointer: "/graph/children/2/url", message: "m").location, "graph.children[2].url")
        XCTAssertEqual(ValidationIssue(pointer: "/graph/headers/a~1b", message: "m").location, "graph.headers.a/b")
        XCTAssertEqual(ValidationIssue(pointer: "", message: "m").location, "body")
        XCTAssertEqual(
            ValidationIssue(pointer: "/graph/url", message: "scheme must be http or https").description,
            "graph.url: scheme must be http or https")
    }

    func testRefusedIdCausesNoFalseDuplicate() {
        let body = #"{"graph":{"type":"list","children":[{"id":"root.1","type":"fetch","url":"http://a/"},{"id":"bad id","type":"fetch","url":"http://a/"}]}}"#
        XCTAssertEqual(refusalIssues(body).map(\.pointer), ["/graph/children/1/id"])
    }

    func testEveryDuplicateIdIsReportedAtItsLaterOccurrence() {
        let leaf = #""type":"fetch","url":"http://a/""#
        let body = #"{"graph":{"type":"sequence","children":[{"id":"a",\#(leaf)},{"id":"a",\#(leaf)},{"id":"a",\#(leaf)}]}}"#
        let found = refusalIssues(body)
        XCTAssertEqual(found.map(\.pointer), ["/graph/children/1/id", "/graph/children/2/id"])
        XCTAssertTrue(found.allSatisfy { $0.message.contains("/graph/children/0") }, "\(found)")
    }

    func testUrlsThatAreAccepted() throws {
        let urls = [
            "http://a", "https://api.local/profile", "HTTP://EXAMPLE.com:8443/a/b?c=d&e=%20#frag", "http://[::1]:8080/x",
            "http://user:pw@127.0.0.1:1/", "https://xn--bcher-kva.example/", "http://a.b-c_d~e/?q=[1]",
        ]
        for url in urls {
            let body = #"{"graph":{"type":"fetch","url":"\#(url)"}}"#
            XCTAssertEqual(try JobSpec.parse(try JSONValue.parse(body)).graph.root.fetchRequest?.url, url)
        }
    }

    func testUrlsThatAreRefused() {
        let table: [(String, String)] = [
            ("http://a:/", "port"), ("http://a:0/", "port"), ("http://a:8o/", "port"), ("http://[::1/", "invalid host"),
            ("http://a<b/", "invalid host"), (#"http://caf\u00e9.fr/"#, "ASCII"), ("mailto:x@y", "scheme"),
            ("javascript:alert(1)", "scheme"), ("", "absolute"), ("://a/", "absolute"), ("http//a/", "absolute"),
            (#"http://a/\t"#, "white space"), (#"http://a/\u007f"#, "control"),
        ]
        for (url, fragment) in table {
            let found = refusalIssues(#"{"graph":{"type":"fetch","url":"\#(url)"}}"#)
            XCTAssertEqual(found.first?.pointer, "/graph/url", url)
            XCTAssertTrue(found.first?.message.contains(fragment) == true, "\(url): \(found)")
        }
    }

    func testResponseBodyCarriesTheFirstIssueAndAllIssues() {
        let error = ValidationError(issues: [
            ValidationIssue(pointer: "/graph/children/2/url", message: "scheme must be http or https"),
            ValidationIssue(pointer: "/name", message: "must be a string"),
        ])
        XCTAssertEqual(
            error.responseBody.text,
            #"{"error":{"code":"invalid_graph","message":"graph.children[2].url: scheme must be http or https","#
                + #""path":"/graph/children/2/url","issues":[{"path":"/graph/children/2/url","#
                + #""message":"scheme must be http or https"},{"path":"/name","message":"must be a string"}]}}"#)
    }
}

/// A fetch's URL as the validator checks it: each row one URL and the problem found, or `nil`.
final class URLCheckTests: XCTestCase {
    func testEachProblemOfAURLIsFoundAndAGoodURLHasNone() {
        let absolute = "must be an absolute http or https URL (http://host/path)"
        let port = "has an invalid port (1 to 65535)"
        let rows: [(url: String, problem: String?)] = [
            ("http://a/", nil),
            ("HTTPS://Example.com:8443/a?b=c#d", nil),
            ("hTtP://a", nil),
            ("http://[::1]:8080/", nil),
            ("http://user:pw@host:1/", nil),
            ("http://a:65535/", nil),
            ("http://a:65536/", port),
            ("http://a:0/", port),
            ("http://a:/", port),
            ("http://a:123456/", port),
            ("http://a:8x/", port),
            ("ftp://a/b", "scheme must be http or https"),
            ("httpx://a", "scheme must be http or https"),
            ("httpss://a", "scheme must be http or https"),
            ("htt://a", "scheme must be http or https"),
            ("hxxp://a", "scheme must be http or https"),
            ("http:/a", absolute),
            ("1http://a", absolute),
            ("://a", absolute),
            ("http://", "must have a host"),
            ("http://:80/", "must have a host"),
            ("http://a b/", "must not contain white space or control characters"),
            ("http://a\u{7F}/", "must not contain white space or control characters"),
            ("http://é/", "must be ASCII; percent-encode other characters"),
            // Both: white space is reported, wherever each stands.
            ("http://é/a b", "must not contain white space or control characters"),
            ("http://a b/é", "must not contain white space or control characters"),
            ("http1://a", "scheme must be http or https"),
            // One letter off at each place of "https".
            ("xttps://a", "scheme must be http or https"),
            ("hxtps://a", "scheme must be http or https"),
            ("htxps://a", "scheme must be http or https"),
            ("httxs://a", "scheme must be http or https"),
            ("httpx://a/", "scheme must be http or https"),
            ("HTTPS://a", nil),
            ("http://a^b/", "has an invalid host"),
            ("http://[::1/", "has an invalid host"),
            ("http://[::1]x/", "has an invalid host"),
            ("http://[]/", "has an invalid host"),
            ("http://abcdefghijklmnopqrstuvwxyz0123456789", "must be at most 40 bytes"),
            ("http://a@b@c:8/", nil),
            ("http://user@/", "must have a host"),
            ("http://u@[::1]:80/", nil),
            ("http://[::g]/", "has an invalid host"),
            ("http://[::1]:/", port),
            ("http://a?b/c:d", nil),
            ("http://a#b@c", nil),
            ("http://a:00080/", nil),
            ("http://a:000080/", port),
        ]
        for row in rows {
            XCTAssertEqual(URLCheck.problem(row.url, maxBytes: 40), row.problem, row.url)
        }
    }
}
