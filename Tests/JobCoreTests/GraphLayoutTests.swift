import XCTest
@testable import JobCore

final class GraphLayoutTests: XCTestCase {
    private func graph(_ graph: String, file: StaticString = #filePath, line: UInt = #line) throws -> JobGraph {
        try acceptedSpec(#"{"graph":\#(graph)}"#, file: file, line: line).graph
    }

    func testApiExampleParsesWithItsValues() throws {
        let spec = try acceptedSpec(
            #"""
            {"name":"profile-and-messages","graph":{"type":"list","fire_on_first_error":true,"children":[
              {"id":"profile","type":"fetch","url":"http://api.local/profile"},
              {"id":"messages","type":"fetch","url":"http://api.local/messages","retries":2}]},
             "deadline_ms":60000,"metadata":{"requested_by":"nightly-sync"}}
            """#)
        XCTAssertEqual(spec.name, "profile-and-messages")
        XCTAssertEqual(spec.deadlineMs, 60000)
        XCTAssertEqual(spec.metadata, .object(["requested_by": "nightly-sync"]))
        XCTAssertEqual(spec.graph.nodes.map(\.id), ["root", "profile", "messages"])
        XCTAssertEqual(spec.graph.root.kind, .list(ListOptions(fireOnFirstError: true)))
        XCTAssertEqual(spec.graph.nodes[2].fetchRequest?.retries, 2)
    }

    func testDefaultIdsFollowTheTreePath() throws {
        let leaf = #"{"type":"fetch","url":"http://a/"}"#
        let g = try graph(
            #"{"type":"list","children":[\#(leaf),{"type":"sequence","children":[\#(leaf),{"type":"list","children":[\#(leaf)]}]},\#(leaf)]}"#
        )
        XCTAssertEqual(g.nodes.map(\.id), ["root", "root.0", "root.1", "root.1.0", "root.1.1", "root.1.1.0", "root.2"])
        XCTAssertEqual(g.nodes.map(\.index), Array(0..<7))
        XCTAssertEqual(g.nodes.map(\.parent), [nil, 0, 0, 2, 2, 4, 0])
        XCTAssertEqual(g.nodes.map(\.children), [[1, 2, 6], [], [3, 4], [], [5], [], []])
        XCTAssertEqual(g.nodes.map(\.depth), [1, 2, 2, 3, 3, 4, 2])
        XCTAssertEqual(g.nodes.map(\.typeName), ["list", "fetch", "sequence", "fetch", "list", "fetch", "fetch"])
        XCTAssertEqual(g.root.id, "root")
        XCTAssertEqual(g.index(ofNodeID: "root.1.1.0"), 5)
        XCTAssertNil(g.index(ofNodeID: "root.9"))
        XCTAssertEqual(g.descendants(of: 2), 3..<6)
        XCTAssertEqual(g.descendants(of: 0), 1..<7)
        XCTAssertEqual(g.descendants(of: 6), 7..<7)
    }

    func testExplicitIdsReplaceDefaultsButNotTheirChildrensPaths() throws {
        let g = try graph(
            #"{"id":"top","type":"sequence","children":[{"id":"a-1_B.c","type":"fetch","url":"http://a/"},{"id":"inner","type":"list","children":[{"type":"fetch","url":"http://a/"}]}]}"#
        )
        XCTAssertEqual(g.nodes.map(\.id), ["top", "a-1_B.c", "inner", "root.1.0"])
        XCTAssertEqual(g.index(ofNodeID: "inner"), 2)
        XCTAssertEqual(g.node(withID: "root.1.0")?.parent, 2)
        XCTAssertNil(g.index(ofNodeID: "root"))
    }

    func testIdOf64CharactersIsAccepted() throws {
        let id = String(repeating: "z", count: 64)
        XCTAssertEqual(try graph(#"{"id":"\#(id)","type":"fetch","url":"http://a/"}"#).root.id, id)
    }

    func testEveryFieldHasItsDefault() throws {
        let g = try graph(
            #"{"type":"sequence","children":[{"type":"fetch","url":"http://a/"},{"type":"fetch","url":"http://a/","method":"POST"},{"type":"list","children":[{"type":"fetch","url":"http://a/","method":"PATCH"}]}]}"#
        )
        XCTAssertEqual(g.root.kind, .sequence(SequenceOptions(continueOnError: false)))
        guard let get = g.nodes[1].fetchRequest, let post = g.nodes[2].fetchRequest,
            let patch = g.nodes[4].fetchRequest
        else { return XCTFail("fetch nodes expected: \(g.nodes)") }
        XCTAssertEqual(get.url, "http://a/")
        XCTAssertEqual(get.method, "GET")
        XCTAssertTrue(get.headers.isEmpty)
        XCTAssertNil(get.body)
        XCTAssertEqual(get.expect, .auto)
        XCTAssertEqual(get.acceptStatus, [])
        XCTAssertEqual(get.retries, 0)
        XCTAssertEqual(get.retryBackoffMs, 200)
        XCTAssertTrue(get.idempotent)
        XCTAssertNil(get.maxBytes)
        XCTAssertTrue(get.followRedirects)
        XCTAssertEqual(get, FetchRequest(url: "http://a/"))
        XCTAssertFalse(post.idempotent)
        XCTAssertFalse(patch.idempotent)
        guard case .list(let list) = g.nodes[3].kind else { return XCTFail("list expected") }
        XCTAssertFalse(list.fireOnFirstResult)
        XCTAssertFalse(list.fireOnFirstError)
        XCTAssertFalse(list.consumeErrors)
        XCTAssertTrue(list.cancelRemaining)
        XCTAssertNil(list.concurrency)
        for node in g.nodes {
            XCTAssertNil(node.timeoutMs)
            XCTAssertNil(node.recover)
        }
        let bare = try acceptedSpec(#"{"graph":{"type":"fetch","url":"http://a/"}}"#)
        XCTAssertNil(bare.name)
        XCTAssertNil(bare.deadlineMs)
        XCTAssertNil(bare.metadata)
    }

    func testEveryFieldIsRead() throws {
        let g = try graph(
            #"""
            {"type":"list","fire_on_first_result":true,"fire_on_first_error":true,"consume_errors":true,
             "cancel_remaining":false,"concurrency":3.0,"timeout_ms":1e3,"recover":null,"children":[
              {"type":"fetch","url":"HTTPS://Example.com:8443/a?b=c#d","method":"POST",
               "headers":{"X-B":"2","accept":"application/json","X-B":"3"},"json":{"k":[1,2.50]},"expect":"json",
               "accept_status":[404,410,404],"retries":10,"retry_backoff_ms":0,"idempotent":true,
               "max_bytes":10485760,"follow_redirects":false,"recover":{"fallback":true},"timeout_ms":86400000},
              {"type":"fetch","url":"http://[::1]:8080/","body":"raw text","method":"PUT","idempotent":false,"max_bytes":0},
              {"type":"sequence","continue_on_error":true,"children":[{"type":"fetch","url":"http://u:p@127.0.0.1"}]}
            ]}
            """#)
        XCTAssertEqual(
            g.root.kind,
            .list(
                ListOptions(
                    fireOnFirstResult: true, fireOnFirstError: true, consumeErrors: true, cancelRemaining: false,
                    concurrency: 3)))
        XCTAssertEqual(g.root.timeoutMs, 1000)
        XCTAssertEqual(g.root.recover, .some(.null))
        let first = g.nodes[1]
        XCTAssertEqual(first.timeoutMs, 86_400_000)
        XCTAssertEqual(first.recover, .object(["fallback": true]))
        guard let a = first.fetchRequest, let b = g.nodes[2].fetchRequest else { return XCTFail("fetches expected") }
        XCTAssertEqual(a.url, "HTTPS://Example.com:8443/a?b=c#d")
        XCTAssertEqual(a.method, "POST")
        XCTAssertEqual(a.headers.map(\.name), ["X-B", "accept", "X-B"])
        XCTAssertEqual(a.headers.map(\.value), ["2", "application/json", "3"])
        XCTAssertEqual(a.body, .json(.object(["k": [1, .number("2.50")]])))
        XCTAssertEqual(a.expect, .json)
        XCTAssertEqual(a.acceptStatus, [404, 410])
        XCTAssertEqual(a.retries, 10)
        XCTAssertEqual(a.retryBackoffMs, 0)
        XCTAssertTrue(a.idempotent)
        XCTAssertEqual(a.maxBytes, 10_485_760)
        XCTAssertFalse(a.followRedirects)
        XCTAssertEqual(b.body, .text("raw text"))
        XCTAssertFalse(b.idempotent)
        XCTAssertEqual(b.maxBytes, 0)
        XCTAssertEqual(g.nodes[3].kind, .sequence(SequenceOptions(continueOnError: true)))
        XCTAssertEqual(g.nodes[4].fetchRequest?.url, "http://u:p@127.0.0.1")
    }

    func testJsonNullIsABodyAndRecoverNullIsARecovery() throws {
        let g = try graph(#"{"type":"fetch","url":"http://a/","method":"POST","json":null,"recover":null}"#)
        XCTAssertEqual(g.root.fetchRequest?.body, .json(.null))
        XCTAssertEqual(g.root.recover, .some(.null))
    }

    func testPreOrderLayoutOfAWideAndDeepTree() throws {
        // Three levels, three children each: 1 + 3 + 9 + 27 nodes.
        var level = #"{"type":"fetch","url":"http://a/"}"#
        for _ in 0..<3 {
            level = #"{"type":"list","children":[\#(level),\#(level),\#(level)]}"#
        }
        let g = try graph(level)
        XCTAssertEqual(g.nodes.count, 40)
        for node in g.nodes {
            XCTAssertEqual(g.nodes[node.index].index, node.index)
            for (position, child) in node.children.enumerated() {
                XCTAssertEqual(g.nodes[child].parent, node.index)
                XCTAssertEqual(g.nodes[child].depth, node.depth + 1)
                XCTAssertEqual(g.nodes[child].id, "\(node.id).\(position)")
                // Pre-order: a child comes right after its previous sibling's whole subtree.
                let expected = position == 0 ? node.index + 1 : g.descendants(of: node.children[position - 1]).upperBound
                XCTAssertEqual(child, expected)
            }
        }
        XCTAssertEqual(g.nodes[1].id, "root.0")
        XCTAssertEqual(g.nodes[2].id, "root.0.0")
        XCTAssertEqual(g.nodes[3].id, "root.0.0.0")
        XCTAssertEqual(g.nodes[39].id, "root.2.2.2")
    }
}
