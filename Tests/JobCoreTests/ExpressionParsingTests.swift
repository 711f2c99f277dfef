import XCTest
@testable import JobCore

/// API.md §6.2–6.3 at submit: where expressions may stand, what they may read, and the 422 for each refusal.
final class ExpressionParsingTests: XCTestCase {
    /// `sequence [ a, b ]` with `b`'s fields given.
    private func readingB(_ fields: String) -> String {
        #"{"graph": {"type": "sequence", "children": [{"id": "a", "type": "fetch", "url": "http://h/a"}, "#
            + #"{"id": "b", "type": "fetch", \#(fields)}]}}"#
    }

    // MARK: - Pointers

    func testPointersFollowRFC6901() throws {
        XCTAssertEqual(JSONPointerPath("")?.tokens, [])
        XCTAssertEqual(JSONPointerPath("/")?.tokens, [""])
        XCTAssertEqual(JSONPointerPath("/a~1b/c~0d/0")?.tokens, ["a/b", "c~d", "0"])
        XCTAssertEqual(JSONPointerPath("/a//b")?.tokens, ["a", "", "b"])
        XCTAssertNil(JSONPointerPath("a/b"))
        XCTAssertNil(JSONPointerPath("/a~2"))
        XCTAssertNil(JSONPointerPath("/a~"))

        let doc = try JSONValue.parse(#"{"a": [10, {"b/c": 5}], "": 1, "x": "s"}"#)
        func at(_ p: String) -> JSONValue? {
            guard let path = JSONPointerPath(p) else { return nil }
            return try? doc.value(at: path.tokens[...], fullTokens: path.tokens).get()
        }
        XCTAssertEqual(at("/a/0"), 10)
        XCTAssertEqual(at("/a/1/b~1c"), 5)
        XCTAssertEqual(at("/"), 1)
        XCTAssertEqual(at(""), doc)
        XCTAssertNil(at("/a/01"), "leading zero is not an index")
        XCTAssertNil(at("/a/-"))
        XCTAssertNil(at("/a/2"))
        XCTAssertNil(at("/x/y"))
        let path = try XCTUnwrap(JSONPointerPath("/a/1/zz/q"))
        guard case .failure(let miss) = doc.value(at: path.tokens[...], fullTokens: path.tokens) else {
            return XCTFail("found something")
        }
        XCTAssertEqual(miss.tokenIndex, 2)
        XCTAssertEqual(miss.reason, #"/a/1 has no member "zz""#)
    }

    // MARK: - Accepted forms

    func testLoginExampleOfTheContractIsAccepted() throws {
        let spec = try acceptedSpec(
            #"""
            {"input": {"user": "ann"},
             "graph": {"type": "sequence", "children": [
               {"id": "login", "type": "fetch", "method": "POST", "url": "https://api.local/login",
                "json": {"user": {"$ref": "/input/user"}}, "select": "/body"},
               {"id": "me", "type": "fetch", "url": "https://api.local/me",
                "headers": {"Authorization": {"$concat": ["Bearer ", {"$ref": "/nodes/login/result/token"}]}}}
             ]}}
            """#)
        XCTAssertEqual(spec.input, .object(["user": "ann"]))
        let login = try XCTUnwrap(spec.graph.node(withID: "login"))
        XCTAssertEqual(login.dataflow?.select?.tokens, ["body"])
        XCTAssertEqual(
            login.dataflow?.json,
            .object([TemplateMember("user", .ref(ScopeRef(pointer: try XCTUnwrap(JSONPointerPath("/input/user")))))]))
        let me = try XCTUnwrap(spec.graph.node(withID: "me"))
        let headers = try XCTUnwrap(me.dataflow?.headers)
        XCTAssertEqual(headers.map(\.name), ["Authorization"])
        XCTAssertEqual(headers[0].value.parts.count, 2)
        XCTAssertEqual(spec.graph.root.dataflow, nil)
    }

    func testConstantsAreFoldedAndCheckedLikeWrittenValues() throws {
        let spec = try acceptedSpec(
            #"{"graph": {"type": "fetch", "url": {"$concat": ["http://h/", "x"]}, "headers": {"X": {"$literal": "v"}}, "#
                + #""json": {"$literal": {"$ref": "kept as is"}}, "recover": {"a": [{"$literal": 1}]}}}"#)
        let node = spec.graph.root
        XCTAssertNil(node.dataflow)
        XCTAssertEqual(node.fetchRequest?.url, "http://h/x")
        XCTAssertEqual(node.fetchRequest?.headers.first?.value, "v")
        XCTAssertEqual(node.fetchRequest?.body, .json(.object(["$ref": "kept as is"])))
        XCTAssertEqual(node.recover, .object(["a": [1]]))

        let found = refusalIssues(#"{"graph": {"type": "fetch", "url": {"$concat": ["ftp://h/", "x"]}}}"#)
        XCTAssertEqual(found.map(\.pointer), ["/graph/url"])
        XCTAssertTrue(found.first?.message.contains("scheme must be http or https") == true)
    }

    func testQueryAndSelectAreRead() throws {
        let spec = try acceptedSpec(
            readingB(
                #""url": "http://h/b", "query": {"q": "a b", "n": 1.50, "f": false, "id": {"$ref": "/nodes/a/status"}}, "#
                    + #""select": "/body/items""#))
        let b = try XCTUnwrap(spec.graph.node(withID: "b")?.dataflow)
        XCTAssertEqual(b.query.map(\.name), ["q", "n", "f", "id"])
        XCTAssertEqual(b.query[1].value, StringTemplate([.text("1.50")]))
        XCTAssertEqual(b.query[2].value, StringTemplate([.text("false")]))
        XCTAssertEqual(b.select?.text, "/body/items")
        // A list may select too.
        let list = try acceptedSpec(#"{"graph": {"type": "list", "select": "/0", "children": [{"type": "fetch", "url": "http://h/"}]}}"#)
        XCTAssertEqual(list.graph.root.dataflow?.select?.tokens, ["0"])
    }

    func testReadingEarlierChildrenAndTheirDescendantsIsAccepted() throws {
        // seq [ list(x, y) , seq [ fetch z, fetch w(reads x, y, z, input) ] ]
        let spec = try acceptedSpec(
            #"""
            {"input": 1, "graph": {"type": "sequence", "children": [
              {"id": "l", "type": "list", "children": [
                {"id": "x", "type": "fetch", "url": "http://h/x"}, {"id": "y", "type": "fetch", "url": "http://h/y"}]},
              {"type": "sequence", "children": [
                {"id": "z", "type": "fetch", "url": "http://h/z"},
                {"id": "w", "type": "fetch", "url": {"$concat": ["http://h/", {"$ref": "/nodes/x/result/body/id"}]},
                 "headers": {"A": {"$ref": "/nodes/y/status"}}, "body": {"$ref": "/nodes/z/state"},
                 "recover": {"from": {"$ref": "/nodes/l"}, "in": {"$ref": "/input", "default": null}}}]}]}}
            """#)
        let w = try XCTUnwrap(spec.graph.node(withID: "w"))
        XCTAssertNotNil(w.dataflow?.url)
        XCTAssertNotNil(w.dataflow?.body)
        XCTAssertNotNil(w.dataflow?.recover)
        XCTAssertEqual(w.fetchRequest?.url, DataflowParser.urlPlaceholder)
    }

    // MARK: - Refusals, each with its path

    func testEachRefusalHasThePointerOfTheExpression() {
        let ref = #"{"$ref": "/input/x"}"#
        let leaf = #""type": "fetch", "url": "http://h/""#
        // (body, path, fragment of the message)
        let table: [(String, String, String)] = [
            // Places where no expression may stand.
            (#"{"graph": {\#(leaf), "timeout_ms": \#(ref)}}"#, "/graph/timeout_ms", "cannot stand here"),
            (#"{"graph": {\#(leaf), "id": \#(ref)}}"#, "/graph/id", "cannot stand here"),
            (#"{"graph": {"type": \#(ref), "url": "http://h/"}}"#, "/graph/type", "cannot stand here"),
            (#"{"graph": {\#(leaf), "method": \#(ref)}}"#, "/graph/method", "cannot stand here"),
            (#"{"graph": {\#(leaf), "retries": \#(ref)}}"#, "/graph/retries", "cannot stand here"),
            (#"{"graph": {\#(leaf), "accept_status": [404, \#(ref)]}}"#, "/graph/accept_status/1", "cannot stand here"),
            (#"{"graph": {\#(leaf), "headers": \#(ref)}}"#, "/graph/headers", "cannot stand here"),
            (#"{"graph": {\#(leaf), "query": \#(ref)}}"#, "/graph/query", "cannot stand here"),
            (#"{"graph": {"type": "list", "fire_on_first_error": \#(ref), "children": [{\#(leaf)}]}}"#,
             "/graph/fire_on_first_error", "cannot stand here"),
            (#"{"graph": {"type": "list", "children": [\#(ref)]}}"#, "/graph/children/0", "a node cannot be an expression"),
            (#"{"name": \#(ref), "graph": {\#(leaf)}}"#, "/name", "cannot stand here"),
            (#"{"deadline_ms": \#(ref), "graph": {\#(leaf)}}"#, "/deadline_ms", "cannot stand here"),
            // Malformed expressions.
            (#"{"graph": {\#(leaf), "json": {"$ref": "/input/x", "other": 1}}}"#, "/graph/json", "unexpected member \"other\""),
            (#"{"graph": {\#(leaf), "json": {"$ref": "/input", "$literal": 1}}}"#, "/graph/json", "exactly one of"),
            (#"{"graph": {\#(leaf), "json": {"$ref": 5}}}"#, "/graph/json", "$ref must be a string"),
            (#"{"graph": {\#(leaf), "json": {"$ref": "input/x"}}}"#, "/graph/json", "not a valid JSON Pointer"),
            (#"{"graph": {\#(leaf), "json": {"$ref": "/input/~2"}}}"#, "/graph/json", "not a valid JSON Pointer"),
            (#"{"graph": {\#(leaf), "json": {"$ref": "/result"}}}"#, "/graph/json", "must start with /input or /nodes/<id>"),
            (#"{"graph": {\#(leaf), "json": {"$ref": "/nodes"}}}"#, "/graph/json", "must name a node"),
            (#"{"graph": {\#(leaf), "json": {"$ref": "/item/id"}}}"#, "/graph/json", "outside a map template"),
            (#"{"graph": {\#(leaf), "json": [{"$ref": "/index"}]}}"#, "/graph/json/0", "outside a map template"),
            (#"{"graph": {\#(leaf), "json": {"$concat": "x"}}}"#, "/graph/json/$concat", "must be an array"),
            (#"{"graph": {\#(leaf), "json": {"$concat": ["a", 1]}}}"#, "/graph/json/$concat/1", "a $concat part must be"),
            (#"{"graph": {\#(leaf), "headers": {"A": {"$literal": {}}}}}"#, "/graph/headers/A", "$literal here must hold"),
            (#"{"graph": {\#(leaf), "headers": {"A": {"$concat": ["a", {"$ref": "/item"}]}}}}"#,
             "/graph/headers/A/$concat/1", "outside a map template"),
            (#"{"graph": {"type": "fetch", "url": {"x": 1}}}"#, "/graph/url", "or an expression"),
            (#"{"graph": {\#(leaf), "query": {"a": [1]}}}"#, "/graph/query/a", "must be a string, number, boolean or expression"),
            (#"{"graph": {\#(leaf), "query": {"": "x"}}}"#, "/graph/query/", "must not be empty"),
            (#"{"graph": {\#(leaf), "query": "a=b"}}"#, "/graph/query", "must be an object"),
            (#"{"graph": {"type": "list", "query": {}, "children": [{\#(leaf)}]}}"#, "/graph/query", "unknown field"),
            (#"{"graph": {\#(leaf), "select": "body"}}"#, "/graph/select", "must be a JSON Pointer"),
            (#"{"graph": {\#(leaf), "select": 3}}"#, "/graph/select", "must be a JSON Pointer"),
            (#"{"input": 1, "input": 2, "graph": {\#(leaf)}}"#, "/input", "duplicate field"),
            // Below the root: the node's place is spelled out from its parents' only for the field that needs it.
            (#"{"graph": {"type": "list", "children": [{\#(leaf)}, {\#(leaf), "timeout_ms": \#(ref)}]}}"#,
             "/graph/children/1/timeout_ms", "cannot stand here"),
            (#"{"graph": {"type": "sequence", "children": [{\#(leaf)}, {"type": "list", "children": [{\#(leaf)}, {\#(leaf), "select": 3}]}]}}"#,
             "/graph/children/1/children/1/select", "must be a JSON Pointer"),
            (#"{"graph": {"type": "list", "children": [{"type": "list", "children": [{\#(leaf)}, \#(ref)]}]}}"#,
             "/graph/children/0/children/1", "a node cannot be an expression"),
            (#"{"graph": {"type": "map", "items": [1], "template": {\#(leaf), "retries": \#(ref)}}}"#,
             "/graph/template/retries", "cannot stand here"),
            (#"{"graph": {"type": "list", "children": [{"type": "map", "items": [1], "template": {"type": "list", "children": [{\#(leaf), "json": {"$ref": 5}}]}}]}}"#,
             "/graph/children/0/template/children/0/json", "$ref must be a string"),
            (#"{"graph": {"type": "list", "children": \#(ref)}}"#, "/graph/children", "cannot stand here"),
        ]
        for (body, path, fragment) in table {
            let found = refusalIssues(body)
            XCTAssertEqual(found.first?.pointer, path, body)
            XCTAssertTrue(
                found.first?.message.contains(fragment) == true, "\(body): \(found.first?.message ?? "none")")
        }
    }

    func testInputOver64KiBIsRefused() throws {
        let fits = String(repeating: "x", count: 65_536 - 2)
        _ = try acceptedSpec(#"{"input": "\#(fits)", "graph": {"type": "fetch", "url": "http://h/"}}"#)
        let found = refusalIssues(#"{"input": "\#(fits)x", "graph": {"type": "fetch", "url": "http://h/"}}"#)
        XCTAssertEqual(found.map(\.pointer), ["/input"])
        XCTAssertTrue(found[0].message.contains("64 KiB"))
    }

    func testNodesThatMayNotHaveSettledAreRefusedWithTheReason() {
        // seq [ a, list L [ p, q(reads …) ], later ]
        func body(_ pointer: String, in field: String = "json") -> String {
            #"""
            {"graph": {"id": "s", "type": "sequence", "children": [
              {"id": "a", "type": "fetch", "url": "http://h/a"},
              {"id": "L", "type": "list", "children": [
                {"id": "p", "type": "fetch", "url": "http://h/p"},
                {"id": "q", "type": "fetch", "url": "http://h/q", "\#(field)": {"$ref": "\#(pointer)"}}]},
              {"id": "later", "type": "fetch", "url": "http://h/later"}]}}
            """#
        }
        let path = "/graph/children/1/children/1/json"
        let table: [(String, String)] = [
            ("/nodes/p/result", #"reads node "p", which runs alongside node "q" in the list "L""#),
            ("/nodes/q/result", #"reads node "q", which is this node itself"#),
            ("/nodes/L/result", #"reads node "L", which contains node "q""#),
            ("/nodes/s", #"reads node "s", which contains node "q""#),
            ("/nodes/later/result", #"reads node "later", which comes after node "q" in the sequence "s""#),
            ("/nodes/nope/result", #"reads node "nope", which is not a node of this job"#),
        ]
        for (pointer, message) in table {
            let found = refusalIssues(body(pointer))
            XCTAssertEqual(found.map(\.pointer), [path], pointer)
            XCTAssertTrue(found.first?.message.contains(message) == true, "\(pointer): \(found.first?.message ?? "")")
        }
        // recover is read like the rest: its own node is refused there too.
        XCTAssertEqual(refusalIssues(body("/nodes/q/error", in: "recover")).map(\.pointer), ["/graph/children/1/children/1/recover"])
        // The earlier child is fine.
        XCTAssertNoThrow(try JobSpec.parse(try JSONValue.parse(body("/nodes/a/result"))))

        // A descendant of the reader.
        let parent = refusalIssues(
            #"{"graph": {"id": "top", "type": "list", "recover": {"$ref": "/nodes/kid/error"}, "children": [{"id": "kid", "type": "fetch", "url": "http://h/"}]}}"#
        )
        XCTAssertEqual(parent.map(\.pointer), ["/graph/recover"])
        XCTAssertTrue(parent.first?.message.contains(#"reads node "kid", which is inside node "top""#) == true)
    }

    func testEveryBadReferenceIsReportedInDocumentOrder() {
        let found = refusalIssues(
            readingB(
                #""url": {"$concat": ["http://h/", {"$ref": "/nodes/b/x"}]}, "headers": {"A": {"$ref": "/nodes/zz"}}, "#
                    + #""json": {"$ref": "/item"}"#))
        XCTAssertEqual(
            found.map(\.pointer), ["/graph/children/1/json"],
            "syntax problems come first; the order check runs on a graph that is otherwise valid")
        let ordered = refusalIssues(
            readingB(#""url": {"$concat": ["http://h/", {"$ref": "/nodes/b/x"}]}, "headers": {"A": {"$ref": "/nodes/zz"}}"#))
        XCTAssertEqual(ordered.map(\.pointer), ["/graph/children/1/url/$concat/1", "/graph/children/1/headers/A"])
    }

    /// 10,000 nodes, each reading the one before: the check climbs at most the reader's depth per reference.
    func testTenThousandReadersAreCheckedWithoutQuadraticWork() throws {
        var children: [String] = [#"{"id": "n0", "type": "fetch", "url": "http://h/"}"#]
        for k in 1..<9_999 {
            children.append(
                #"{"id": "n\#(k)", "type": "fetch", "url": {"$concat": ["http://h/", {"$ref": "/nodes/n\#(k - 1)/status"}]}}"#)
        }
        let body = try JSONValue.parse(#"{"graph": {"type": "sequence", "children": [\#(children.joined(separator: ","))]}}"#)
        let start = ContinuousClock.now
        let spec = try JobSpec.parse(body)
        print("parsed and checked 10,000 nodes with 9,998 references in \(ContinuousClock.now - start)")
        XCTAssertEqual(spec.graph.nodes.count, 10_000)
        XCTAssertNotNil(spec.graph.node(withID: "n9998")?.dataflow?.url)

        // Every reader reads a node in another branch of a list: each is refused, each once.
        let listBody = try JSONValue.parse(
            #"{"graph": {"type": "list", "children": [\#(children.joined(separator: ","))]}}"#)
        XCTAssertThrowsError(try JobSpec.parse(listBody)) { error in
            XCTAssertEqual((error as? ValidationError)?.issues.count, 100)
        }
    }

    func testAJSONValueHoldingExpressionsNestsAtMost128Levels() throws {
        func body(_ levels: Int) -> String {
            readingB(#""url": "http://h/b", "json": "# + String(repeating: "[", count: levels)
                + #"{"$ref": "/nodes/a/status"}"# + String(repeating: "]", count: levels))
        }
        XCTAssertNoThrow(try acceptedSpec(body(127)))
        let refused = refusalIssues(body(129))
        XCTAssertEqual(refused.map(\.pointer), ["/graph/children/1/json"])
        XCTAssertTrue(refused.first?.message.contains("at most 128 levels") == true, "\(refused)")
    }
    /// The data-flow walk is skipped only where it would find nothing (`DataflowParser.mayHoldDataflow`): each row
    /// but the first two holds one thing the walk reads, refuses or cannot vouch for.
    func testTheDataflowWalkIsSkippedOnlyWhereItWouldFindNothing() throws {
        let fetch = #"{"type": "fetch", "url": "http://h/a", "timeout_ms": 5, "retries": 1}"#
        let rows: [(graph: String, mayHold: Bool)] = [
            (#"{"type": "list", "children": [\#(fetch), \#(fetch)]}"#, false),
            (#"{"type": "sequence", "children": [{"type": "list", "children": [\#(fetch)]}]}"#, false),
            (#"{"type": "list", "children": [{"type": "fetch", "url": "http://h/a", "headers": {"a": "b"}}]}"#, true),
            (#"{"type": "list", "children": [{"type": "fetch", "url": {"$ref": "/input/u"}}]}"#, true),
            (#"{"type": "list", "select": "/0", "children": [\#(fetch)]}"#, true),
            (#"{"type": "list", "children": [{"type": "fetch", "url": "http://h/a", "query": 1}]}"#, true),
            (#"{"type": "list", "children": [{"type": "fetch", "url": "http://h/a", "paginate": 1}]}"#, true),
            (#"{"type": "list", "children": [{"$ref": "/input"}]}"#, true),
            (#"{"type": "list", "children": ["http://h/a"]}"#, true),
            (#"{"type": "list", "children": {"type": "fetch"}}"#, true),
            (#"{"type": "map", "items": [1], "template": \#(fetch)}"#, true),
            (#"{"type": "list", "children": [{"type": "list", "children": [{"type": "list", "children": [\#(fetch)]}]}]}"#, true),
        ]
        var limits = Limits()
        limits.maxDepth = 3
        for (graph, mayHold) in rows {
            let root = try JSONValue.parse(graph)
            XCTAssertEqual(DataflowParser.mayHoldDataflow(root, limits: limits), mayHold, graph)
        }
        var few = Limits()
        few.maxNodes = 2
        XCTAssertTrue(DataflowParser.mayHoldDataflow(try JSONValue.parse(rows[0].graph), limits: few), "past maxNodes")
    }
}
