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

    func testHundredThousandDeepGraphIsRefusedQuicklyAtTheFirstNodeTooDeep() {
        var graph = Self.chain(depth: 100_000)
        var body: JSONValue = .object(["graph": graph])
        let start = ContinuousClock.now
        let found = issues(body)
        let elapsed = ContinuousClock.now - start
        body = .null
        Self.tearDown(&graph)

        XCTAssertLessThan(elapsed, .seconds(1), "took \(elapsed)")
        XCTAssertEqual(found.count, 1, "\(found.prefix(3))")
        XCTAssertEqual(found.first?.pointer, "/graph" + String(repeating: "/children/0", count: 64))
        XCTAssertTrue(found.first?.message.contains("64") == true, found.first?.message ?? "")
        print("100,000-deep graph refused in \(elapsed)")
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

    func testMillionChildrenAreRefusedQuicklyAtTheFirstOverTheLimit() {
        let body: JSONValue = .object(["graph": Self.list(Array(repeating: .object([]), count: 1_000_000))])
        let start = ContinuousClock.now
        let found = issues(body)
        let elapsed = ContinuousClock.now - start
        XCTAssertLessThan(elapsed, .seconds(2), "took \(elapsed)")
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
}
