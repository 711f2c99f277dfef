import XCTest
@testable import JobCore

final class GraphLimitsTests: XCTestCase {
    private static let leaf: JSONValue = .object(["type": "fetch", "url": "http://a/"])

    private func issues(_ body: JSONValue, limits: GraphLimits = GraphLimits()) -> [ValidationIssue] {
        do {
            _ = try JobSpec.parse(body, limits: limits)
            XCTFail("accepted")
        } catch let error as ValidationError {
            return error.issues
        } catch {
            XCTFail("unexpected \(error)")
        }
        return []
    }

    private static func list(_ children: [JSONValue]) -> JSONValue {
        .object(["type": "list", "children": .array(children)])
    }

    /// A chain of `depth` nested lists around a fetch, built without recursion.
    private static func chain(depth: Int) -> JSONValue {
        var value = leaf
        for _ in 1..<depth { value = list([value]) }
        return value
    }

    /// Releases a chain one layer at a time, so that no deinit recurses through it.
    private static func tearDown(_ chain: inout JSONValue) {
        while case .object(let members) = chain, let inner = members.last?.value.arrayValue?.first {
            chain = inner
        }
        chain = .null
    }

    func testHundredThousandDeepGraphIsRefusedAtTheFirstNodeTooDeep() {
        var graph = Self.chain(depth: 100_000)
        var body: JSONValue = .object(["graph": graph])
        let found = issues(body)
        body = .null
        Self.tearDown(&graph)

        XCTAssertEqual(found.count, 1, "\(found.prefix(3))")
        XCTAssertEqual(found.first?.pointer, "/graph" + String(repeating: "/children/0", count: 64))
        XCTAssertTrue(found.first?.message.contains("64") == true, found.first?.message ?? "")
    }

    func testDeepGraphParsedFromTextIsRefused() throws {
        let depth = 2_000
        let text =
            #"{"graph":"# + String(repeating: #"{"type":"list","children":["#, count: depth - 1)
            + #"{"type":"fetch","url":"http://a/"}"# + String(repeating: "]}", count: depth - 1) + "}"
        var body = try JSONValue.parse(text, maxDepth: 3 * depth)
        let found = issues(body)
        XCTAssertEqual(found.map(\.pointer), ["/graph" + String(repeating: "/children/0", count: 64)])
        if case .object(let members) = body, var graph = members.first?.value {
            body = .null
            Self.tearDown(&graph)
        }
    }

    func testDepthExactlyAtTheLimitIsAccepted() throws {
        var graph = Self.chain(depth: 64)
        let spec = try JobSpec.parse(.object(["graph": graph]))
        XCTAssertEqual(spec.graph.nodes.count, 64)
        XCTAssertEqual(spec.graph.nodes.last?.depth, 64)
        XCTAssertEqual(spec.graph.nodes.last?.id, "root" + String(repeating: ".0", count: 63))
        Self.tearDown(&graph)
    }

    func testOnlyTheFirstNodeTooDeepIsReported() {
        var limits = GraphLimits()
        limits.maxDepth = 2
        let tooDeep = Self.list([Self.leaf])
        let body: JSONValue = .object(["graph": Self.list([Self.leaf, tooDeep, tooDeep])])
        let found = issues(body, limits: limits)
        XCTAssertEqual(found.map(\.pointer), ["/graph/children/1/children/0"])
    }

    func testMoreThanMaxNodesIsRefusedAtTheFirstNodeOverTheLimit() {
        let body: JSONValue = .object(["graph": Self.list(Array(repeating: Self.leaf, count: 10_000))])
        let found = issues(body)
        XCTAssertEqual(found.count, 1)
        XCTAssertEqual(found.first?.pointer, "/graph/children/9999")
        XCTAssertTrue(found.first?.message.contains("10000") == true, found.first?.message ?? "")
    }

    func testExactlyMaxNodesIsAccepted() throws {
        let body: JSONValue = .object(["graph": Self.list(Array(repeating: Self.leaf, count: 9_999))])
        let spec = try JobSpec.parse(body)
        XCTAssertEqual(spec.graph.nodes.count, 10_000)
        XCTAssertEqual(spec.graph.index(ofNodeID: "root.9998"), 9_999)
    }

    func testMaxNodesCountsInPreOrderAcrossLevels() {
        var limits = GraphLimits()
        limits.maxNodes = 4
        // Pre-order: root, root.0, root.0.0, root.0.1, root.1 ← the fifth node.
        let body: JSONValue = .object(["graph": Self.list([Self.list([Self.leaf, Self.leaf]), Self.leaf])])
        XCTAssertEqual(issues(body, limits: limits).map(\.pointer), ["/graph/children/1"])
    }

    func testMaxBytesFollowsTheServerLimit() throws {
        var limits = GraphLimits()
        limits.maxResponseBytes = 1000
        let fetch: JSONValue = .object(["type": "fetch", "url": "http://a/", "max_bytes": 1001])
        let found = issues(.object(["graph": fetch]), limits: limits)
        XCTAssertEqual(found.map(\.pointer), ["/graph/max_bytes"])
        XCTAssertTrue(found.first?.message.contains("from 0 to 1000") == true)
        let ok: JSONValue = .object(["type": "fetch", "url": "http://a/", "max_bytes": 1000])
        XCTAssertEqual(try JobSpec.parse(.object(["graph": ok]), limits: limits).graph.root.fetchRequest?.maxBytes, 1000)
    }

    func testMetadataUpTo16KiBIsAcceptedAndOneByteMoreRefused() throws {
        // {"k":"xxx…"} is 8 bytes plus the x's.
        let fits: JSONValue = .object(["k": .string(String(repeating: "x", count: 16_384 - 8))])
        XCTAssertEqual(fits.bytes.count, 16_384)
        let spec = try JobSpec.parse(.object(["graph": Self.leaf, "metadata": fits]))
        XCTAssertEqual(spec.metadata, fits)

        let over: JSONValue = .object(["k": .string(String(repeating: "x", count: 16_384 - 7))])
        let found = issues(.object(["graph": Self.leaf, "metadata": over]))
        XCTAssertEqual(found.map(\.pointer), ["/metadata"])
    }

    func testMetadataSizeCountsEscapesAsStored() {
        let samples: [JSONValue] = [
            .object(["a\"b": "line\nbreak\t\u{01}é😀", "n": [1, .number("2.50"), true, false, .null, [], .object([])]]),
            .object([]),
            .object(["nested": .object(["x": ["\\", "/"]])]),
        ]
        for sample in samples {
            XCTAssertEqual(compactSize(sample, limit: 1 << 20), sample.bytes.count, sample.text)
        }
        XCTAssertNil(compactSize(.object(["k": .string(String(repeating: "x", count: 100))]), limit: 50))
    }

    func testMillionChildrenAreRefusedAtTheFirstOverTheLimit() {
        let body: JSONValue = .object(["graph": Self.list(Array(repeating: .object([]), count: 1_000_000))])
        let found = issues(body)
        // The first 10,000 are each missing a type; the cap on issues stops the walk first.
        XCTAssertEqual(found.count, 101)
        XCTAssertEqual(found.first?.pointer, "/graph/children/0/type")
    }

    func testWideTreeOverTheLimitIsReportedOnceAtTheRightNode() {
        var limits = GraphLimits()
        limits.maxNodes = 50
        let body: JSONValue = .object(["graph": Self.list(Array(repeating: Self.leaf, count: 100_000))])
        XCTAssertEqual(issues(body, limits: limits).map(\.pointer), ["/graph/children/49"])
    }

    // MARK: - Large bodies, parsed from text as the server does

    private static let fetchText = #"{"type":"fetch","url":"http://a/"}"#

    private static func listText(_ children: Int, child: String = fetchText) -> String {
        #"{"graph":{"type":"list","children":["# + Array(repeating: child, count: children).joined(separator: ",")
            + "]}}"
    }

    func testFiftyThousandNodeListIsAcceptedWithEveryNodeInPlace() throws {
        let limits = Limits(maxNodes: 50_000)
        let body = try JSONValue.parse(Self.listText(49_999), maxDepth: limits.requestJSONDepth)
        let graph = try JobSpec.parse(body, limits: limits).graph
        XCTAssertEqual(graph.nodes.count, 50_000)
        XCTAssertEqual(graph.root.children, Array(1..<50_000))
        XCTAssertEqual(graph.descendants(of: 0), 1..<50_000)
        XCTAssertEqual(graph.descendants(of: 49_999), 50_000..<50_000)
        for i in [1, 2, 25_000, 49_999] {
            XCTAssertEqual(graph.nodes[i].id, "root.\(i - 1)")
            XCTAssertEqual(graph.nodes[i].parent, 0)
            XCTAssertEqual(graph.nodes[i].fetchRequest?.url, "http://a/")
            XCTAssertEqual(graph.index(ofNodeID: "root.\(i - 1)"), i)
        }
        // One more node is refused, at the node past the limit.
        let over = try JSONValue.parse(Self.listText(50_000), maxDepth: limits.requestJSONDepth)
        XCTAssertEqual(issues(over, limits: limits).map(\.pointer), ["/graph/children/49999"])
    }

    func testEighteenThousandBadNodesStopAtAHundredIssuesInDocumentOrder() throws {
        let body = try JSONValue.parse(Self.listText(17_999, child: #"{"type":"fetch","url":"ftp://a/","retries":99}"#))
        let found = issues(body, limits: Limits(maxNodes: 20_000))
        XCTAssertEqual(found.count, 101)
        XCTAssertEqual(found[0].pointer, "/graph/children/0/url")
        XCTAssertEqual(found[1].pointer, "/graph/children/0/retries")
        XCTAssertEqual(found[99].pointer, "/graph/children/49/retries")
        XCTAssertTrue(found[100].message.contains("stopped after 100"), found[100].message)
    }

    func testFortyThousandKeyMetadataIsRefusedAtMetadata() throws {
        let keys = (0..<40_000).map { #""key\#($0)":\#($0)"# }.joined(separator: ",")
        let body = try JSONValue.parse(#"{"graph":\#(Self.fetchText),"metadata":{\#(keys)}}"#)
        XCTAssertEqual(body["metadata"]?.objectValue?.count, 40_000)
        let found = issues(body)
        XCTAssertEqual(found.map(\.pointer), ["/metadata"])
        XCTAssertTrue(found.first?.message.contains("16384 bytes") == true, found.first?.message ?? "")
    }

    func testMetadataKeepsItsKeysInOrderDuplicatesIncluded() throws {
        // 1,000 keys fit in 16 KiB; the order is not sorted, and "dup" appears three times.
        var members = (0..<1_000).map { #""k\#(($0 * 7) % 1_000)":\#($0)"# }
        members.insert(#""dup":1"#, at: 0)
        members.insert(#""dup":2"#, at: 500)
        members.append(#""dup":3"#)
        let text = "{" + members.joined(separator: ",") + "}"
        let spec = try JobSpec.parse(try JSONValue.parse(#"{"graph":\#(Self.fetchText),"metadata":\#(text)}"#))
        let metadata = try XCTUnwrap(spec.metadata)
        XCTAssertEqual(metadata.text, text)
        XCTAssertEqual(metadata.objectValue?.map(\.key).filter { $0 == "dup" }.count, 3)
        XCTAssertEqual(metadata["dup"], 3)
    }

    func testDuplicateFieldsInANodeAreStillRefusedAtTheLaterOne() throws {
        let body = try JSONValue.parse(#"{"graph":{"type":"fetch","url":"http://a/","retries":1,"retries":2}}"#)
        XCTAssertEqual(issues(body).map(\.pointer), ["/graph/retries"])
    }

    // MARK: - Limits derived from one value

    /// A chain of `depth` sequences around a fetch whose `json` body nests `extra` arrays around `1`, as JSON text.
    private static func chainText(depth: Int, extra: Int) -> String {
        let leaf = #"{"type":"fetch","method":"POST","url":"http://a/","json":"#
            + String(repeating: "[", count: extra) + "1" + String(repeating: "]", count: extra) + "}"
        return #"{"graph":"# + String(repeating: #"{"type":"sequence","children":["#, count: depth - 1) + leaf
            + String(repeating: "]}", count: depth - 1) + "}"
    }

    func testRequestJSONDepthAdmitsEveryGraphTheDepthLimitAdmits() throws {
        for maxDepth in [1, 64, 200, 2_500] {
            let limits = Limits(maxDepth: maxDepth)
            // The deepest graph, with a fetch body nesting as deep again as the graph's own JSON.
            let text = Self.chainText(depth: maxDepth, extra: 2 * maxDepth)
            var body = try JSONValue.parse(text, maxDepth: limits.requestJSONDepth)
            var graph = try JobSpec.parse(body, limits: limits).graph
            XCTAssertEqual(graph.nodes.count, maxDepth)
            XCTAssertEqual(graph.nodes.last?.depth, maxDepth)
            // What was accepted is read back whatever the limits are now.
            XCTAssertNoThrow(try JSONValue.parse(text, maxDepth: Limits.storedJSONDepth))
            graph = JobGraph(nodes: [])
            Self.tearDownText(&body)
        }
        XCTAssertGreaterThanOrEqual(
            Limits.storedJSONDepth, Limits(maxDepth: Limits.maxDepthCeiling).requestJSONDepth)
    }

    func testStoredJobsAreRebuiltWhateverTheNodeAndDepthLimitsAreNow() throws {
        let acceptedWide = Limits(maxNodes: 4)
        let acceptedDeep = Limits(maxDepth: 3_000)
        let wide = try JSONValue.parse(Self.listText(3))
        let deepText = Self.chainText(depth: 2_500, extra: 0)
        var deep = try JSONValue.parse(deepText, maxDepth: acceptedDeep.requestJSONDepth)
        let wideNodes = try JobSpec.parse(wide, limits: acceptedWide).graph.nodes.count
        let deepNodes = try JobSpec.parse(deep, limits: acceptedDeep).graph.nodes.count

        // Restarted with lower limits: new submissions are held to them, stored jobs are not.
        let now = Limits(maxNodes: 2, maxDepth: 64, maxResponseBytes: 10)
        XCTAssertEqual(issues(wide, limits: now).map(\.pointer), ["/graph/children/1"])
        XCTAssertEqual(issues(deep, limits: now).count, 1)
        XCTAssertEqual(try JobSpec.parse(wide, limits: now.forStoredJobs).graph.nodes.count, wideNodes)
        XCTAssertEqual(try JobSpec.parse(deep, limits: now.forStoredJobs).graph.nodes.count, deepNodes)
        XCTAssertEqual(deepNodes, 2_500)
        // The API's own rules still hold for a stored job.
        let bad = try JSONValue.parse(#"{"graph":{"type":"fetch","url":"ftp://a/"}}"#)
        XCTAssertEqual(issues(bad, limits: now.forStoredJobs).map(\.pointer), ["/graph/url"])
        Self.tearDownText(&deep)
    }

    /// Releases a body parsed from `chainText` one layer at a time.
    private static func tearDownText(_ body: inout JSONValue) {
        guard var node = body["graph"] else { return }
        body = .null
        while let inner = node["children"]?.arrayValue?.first { node = inner }
        node = .null
    }
}
