import XCTest
@testable import JobCore

/// API.md §6.2 when a node starts: values found in the scope, their types, url encoding, and each failure kind.
final class ExpressionResolutionTests: XCTestCase {
    /// seq [ login (succeeded), broken (failed 503), later fetch ] with input {"user": "ann", "n": 2.50}.
    private func scope() throws -> (ExpressionScope, JobGraph) {
        let spec = try JobSpec.parse(
            try JSONValue.parse(
                #"""
                {"input": {"user": "ann", "n": 2.50, "t": true, "o": {"k": 1}, "nl": "a\r\nb", "list": [10, 20]},
                 "graph": {"type": "sequence", "continue_on_error": true, "children": [
                   {"id": "login", "type": "fetch", "url": "http://h/login"},
                   {"id": "broken", "type": "fetch", "url": "http://h/broken"},
                   {"id": "later", "type": "fetch", "url": "http://h/later"}]}}
                """#))
        var nodes = spec.graph.nodes.map { NodeRecord(jobID: "j", id: $0.id, parent: nil, position: $0.index, type: $0.typeName) }
        nodes[1].state = .succeeded
        nodes[1].status = 200
        nodes[1].result = try JSONValue.parse(#"{"status": 200, "body": {"token": "t/k n", "ids": [7, 8]}}"#)
        nodes[2].state = .failed
        nodes[2].status = 503
        nodes[2].error = NodeError(.httpStatus, "answered 503", node: "broken", status: 503)
        return (ExpressionScope(input: spec.input, graph: spec.graph, nodes: nodes), spec.graph)
    }

    private func ref(_ pointer: String, default value: JSONValue? = nil) throws -> ScopeRef {
        ScopeRef(pointer: try XCTUnwrap(JSONPointerPath(pointer)), defaultValue: value)
    }

    func testLookupReadsInputAndNodeRecords() throws {
        let (scope, _) = try scope()
        func at(_ p: String) throws -> JSONValue? { try? ExpressionResolver.lookup(ref(p), in: scope).get() }
        XCTAssertEqual(try at("/input/user"), "ann")
        XCTAssertEqual(try at("/input/n"), .number("2.50"), "numbers keep their literal text")
        XCTAssertEqual(try at("/nodes/login/result/body/token"), "t/k n")
        XCTAssertEqual(try at("/nodes/login/result/body/ids/1"), 8)
        XCTAssertEqual(try at("/nodes/login/status"), 200)
        XCTAssertEqual(try at("/nodes/login/state"), "succeeded")
        XCTAssertEqual(try at("/nodes/broken/state"), "failed")
        XCTAssertEqual(try at("/nodes/broken/error/kind"), "http_status")
        XCTAssertEqual(try at("/nodes/broken/status"), 503)
        XCTAssertEqual(try at("/nodes/broken"), try JSONValue.parse(
            #"{"state": "failed", "error": {"kind": "http_status", "message": "answered 503", "node": "broken", "status": 503}, "status": 503}"#))
        XCTAssertNil(try at("/nodes/login/error"))
    }

    func testMissingValuesUseTheDefaultOrNameTheFirstMissingSegment() throws {
        let (scope, _) = try scope()
        XCTAssertEqual(try ExpressionResolver.lookup(ref("/input/none", default: .null), in: scope).get(), .null)
        XCTAssertEqual(try ExpressionResolver.lookup(ref("/nodes/broken/result/x", default: 5), in: scope).get(), 5)

        let cases: [(String, String)] = [
            ("/nodes/login/result/body/nope/deeper", #"segment "nope" is missing (/nodes/login/result/body has no member "nope")"#),
            ("/nodes/login/result/body/ids/2", #"segment "2" is missing (/nodes/login/result/body/ids is an array of 2, with no index 2)"#),
            ("/nodes/broken/result", #"segment "result" is missing (node "broken" has no result: it ended failed)"#),
            ("/input/user/x", #"segment "x" is missing (/input/user is a string, which has no "x")"#),
        ]
        for (pointer, fragment) in cases {
            guard case .failure(let error) = ExpressionResolver.lookup(try ref(pointer), in: scope) else {
                XCTFail("found something at \(pointer)")
                continue
            }
            XCTAssertEqual(error.kind, .refUnresolved)
            XCTAssertTrue(error.message.contains("\"\(pointer)\""), error.message)
            XCTAssertTrue(error.message.contains(fragment), error.message)
        }
    }

    func testStringPositionsTakeScalarsAsTheirJSONText() throws {
        let (scope, _) = try scope()
        let template = StringTemplate([
            .text("u="), .ref(try ref("/input/user")), .text(" n="), .ref(try ref("/input/n")), .text(" t="),
            .ref(try ref("/input/t")),
        ])
        XCTAssertEqual(try ExpressionResolver.string(template, in: scope, place: "x").get(), "u=ann n=2.50 t=true")
        guard case .failure(let error) = ExpressionResolver.string(StringTemplate([.ref(try ref("/input/o"))]), in: scope, place: "header A")
        else { return XCTFail("an object was taken as a string") }
        XCTAssertEqual(error.kind, .refType)
        XCTAssertTrue(error.message.contains("in header A must be a string, number or boolean, not an object"), error.message)
    }

    func testValueTemplatesInsertValuesAsTheyAre() throws {
        let (scope, _) = try scope()
        let template = ValueTemplate.object([
            TemplateMember("o", .ref(try ref("/input/o"))),
            TemplateMember("n", .ref(try ref("/input/n"))),
            TemplateMember("s", .concat(StringTemplate([.text("#"), .ref(try ref("/input/list/0"))]))),
            TemplateMember("keep", .value(.object(["$ref": "as is"]))),
            TemplateMember("arr", .array([.ref(try ref("/input/list")), .value(.null)])),
        ])
        let value = try ExpressionResolver.value(template, in: scope, place: "json").get()
        XCTAssertEqual(value.text, ##"{"o":{"k":1},"n":2.50,"s":"#10","keep":{"$ref":"as is"},"arr":[[10,20],null]}"##)
    }

    func testRequestsAreBuiltEncodedAndCheckedAgain() throws {
        let (scope, _) = try scope()
        var flow = NodeDataflow()
        flow.url = StringTemplate([.text("http://h/users/"), .ref(try ref("/nodes/login/result/body/token")), .text("/x")])
        flow.query = [
            NamedTemplate(name: "a b", value: StringTemplate([.text("1&2")])),
            NamedTemplate(name: "n", value: StringTemplate([.ref(try ref("/input/n"))])),
        ]
        flow.headers = [NamedTemplate(name: "Authorization", value: StringTemplate([.text("Bearer "), .ref(try ref("/input/user"))]))]
        flow.body = StringTemplate([.ref(try ref("/input/user"))])
        let base = FetchRequest(url: DataflowParser.urlPlaceholder, method: "POST")
        let request = try ExpressionResolver.request(base, flow, in: scope).get()
        XCTAssertEqual(request.url, "http://h/users/t%2Fk%20n/x?a%20b=1%262&n=2.50")
        XCTAssertEqual(request.headers.map(\.value), ["Bearer ann"])
        XCTAssertEqual(request.body, .text("ann"))

        var crlf = NodeDataflow()
        crlf.headers = [NamedTemplate(name: "X", value: StringTemplate([.ref(try ref("/input/nl"))]))]
        XCTAssertEqual(resolveError(base, crlf, scope)?.kind, .refType)

        var scheme = NodeDataflow()
        scheme.url = StringTemplate([.ref(try ref("/input/user")), .text("://h/")])
        let bad = resolveError(base, scheme, scope)
        XCTAssertEqual(bad?.kind, .invalidURL)
        XCTAssertTrue(bad?.message.contains("scheme must be http or https") == true)

        // A whole url from one reference is one component: its slashes are encoded, so it is never a URL.
        var whole = NodeDataflow()
        whole.url = StringTemplate([.ref(try ref("/input/user"))])
        XCTAssertEqual(resolveError(base, whole, scope)?.kind, .invalidURL)
    }

    /// `isEmpty` reads each field rather than comparing with `NodeDataflow()`: one row per field, each set alone, and
    /// the rows are as many as the fields, so a field added without its row (or without its place in `isEmpty`) fails.
    func testADataFlowIsEmptyOnlyWithEveryFieldUnset() throws {
        let text = StringTemplate([.text("x")])
        let named = [NamedTemplate(name: "n", value: text)]
        let pointer = try XCTUnwrap(JSONPointerPath("/a"))
        let rows: [(String, (inout NodeDataflow) -> Void)] = [
            ("url", { $0.url = text }),
            ("headers", { $0.headers = named }),
            ("query", { $0.query = named }),
            ("body", { $0.body = text }),
            ("json", { $0.json = .value(1) }),
            ("recover", { $0.recover = .value(1) }),
            ("select", { $0.select = pointer }),
            ("paginate", { $0.paginate = PaginateSpec(next: .link) }),
            ("items", { $0.items = .value([]) }),
        ]
        XCTAssertEqual(rows.count, Mirror(reflecting: NodeDataflow()).children.count)
        XCTAssertTrue(NodeDataflow().isEmpty)
        for (field, set) in rows {
            var flow = NodeDataflow()
            set(&flow)
            XCTAssertNotEqual(flow, NodeDataflow(), field)
            XCTAssertFalse(flow.isEmpty, field)
        }
    }

    private func resolveError(_ base: FetchRequest, _ flow: NodeDataflow, _ scope: ExpressionScope) -> NodeError? {
        if case .failure(let error) = ExpressionResolver.request(base, flow, in: scope) { return error }
        return nil
    }

    func testPercentEncodingKeepsOnlyUnreservedCharacters() {
        XCTAssertEqual(ExpressionResolver.percentEncode("AZaz09-._~"), "AZaz09-._~")
        XCTAssertEqual(ExpressionResolver.percentEncode("a b/?#[]@!$&'()*+,;=%"), "a%20b%2F%3F%23%5B%5D%40%21%24%26%27%28%29%2A%2B%2C%3B%3D%25")
        XCTAssertEqual(ExpressionResolver.percentEncode("é😀"), "%C3%A9%F0%9F%98%80")
        XCTAssertEqual(ExpressionResolver.percentEncode(""), "")
    }

    func testQueryIsAppendedBeforeTheFragmentAndAfterAnExistingQuery() {
        let pairs = [("a", "1"), ("b", "x y")]
        XCTAssertEqual(ExpressionResolver.appendQuery(to: "http://h/p", pairs), "http://h/p?a=1&b=x%20y")
        XCTAssertEqual(ExpressionResolver.appendQuery(to: "http://h/p?z=0", pairs), "http://h/p?z=0&a=1&b=x%20y")
        XCTAssertEqual(ExpressionResolver.appendQuery(to: "http://h/p?", pairs), "http://h/p?a=1&b=x%20y")
        XCTAssertEqual(ExpressionResolver.appendQuery(to: "http://h/p#f", pairs), "http://h/p?a=1&b=x%20y#f")
        XCTAssertEqual(ExpressionResolver.appendQuery(to: "http://h/p", []), "http://h/p")
    }

    func testSelectNarrowsOrFailsWithRefUnresolved() throws {
        let result = try JSONValue.parse(#"{"status": 200, "body": {"items": [1, 2]}}"#)
        XCTAssertEqual(try ExpressionResolver.select(try XCTUnwrap(JSONPointerPath("/body/items")), from: result).get(), [1, 2])
        XCTAssertEqual(try ExpressionResolver.select(try XCTUnwrap(JSONPointerPath("")), from: result).get(), result)
        guard case .failure(let error) = ExpressionResolver.select(try XCTUnwrap(JSONPointerPath("/body/x")), from: result) else {
            return XCTFail("found something")
        }
        XCTAssertEqual(error.kind, .refUnresolved)
        XCTAssertTrue(error.message.contains(#"select "/body/x""#), error.message)
    }

    func testStoredRequestMasksCredentialsWhenShownAndRebuildsTheSameRequest() throws {
        let sent = FetchRequest(
            url: "http://h/x?a=1", method: "POST",
            headers: [("Authorization", "Bearer s"), ("cookie", "c=1"), ("Proxy-Authorization", "p"), ("X", "y")],
            body: .json(.object(["k": .number("1.0")])))
        let stored = RequestRecord.json(sent, keepBody: true)
        XCTAssertEqual(
            RequestRecord.shown(stored).text,
            #"{"method":"POST","url":"http://h/x?a=1","headers":{"Authorization":"***","cookie":"***","Proxy-Authorization":"***","X":"y","Content-Type":"application/json"}}"#)
        let base = FetchRequest(url: DataflowParser.urlPlaceholder, method: "POST", body: .json(.null))
        let again = try XCTUnwrap(RequestRecord.request(from: stored, base: base))
        XCTAssertEqual(again.url, sent.url)
        XCTAssertEqual(again.body, sent.body)
        XCTAssertEqual(again.headers.map(\.name), ["Authorization", "cookie", "Proxy-Authorization", "X", "Content-Type"])
        XCTAssertEqual(again.headers.first?.value, "Bearer s")
    }
}
