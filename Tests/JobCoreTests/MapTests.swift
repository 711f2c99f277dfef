import Foundation
import TestSupport
import Threads
import XCTest

@testable import JobCore

/// The submit-time checks of a `map` node (API.md §7.1): every refusal with its JSON Pointer, and the shape the
/// template takes once accepted.
final class MapValidationTests: XCTestCase {
    private static let leaf = #""type": "fetch", "url": "http://h/x""#

    func testEachRefusalHasThePointerOfItsFirstProblem() {
        let leaf = Self.leaf
        let table: [(String, String, String)] = [
            (#"{"graph": {"type": "map", "template": {\#(leaf)}}}"#, "/graph/items", "is required"),
            (#"{"graph": {"type": "map", "items": [1]}}"#, "/graph/template", "is required"),
            (#"{"graph": {"type": "map", "items": 5, "template": {\#(leaf)}}}"#, "/graph/items", "must be an array, or an expression"),
            (#"{"graph": {"type": "map", "items": [], "template": "x"}}"#, "/graph/template", "must be an object"),
            (#"{"graph": {"type": "map", "items": [], "template": {"type": "fetch", "url": "ftp://h/"}}}"#,
             "/graph/template/url", "scheme must be http or https"),
            (#"{"graph": {"type": "map", "items": [], "template": {"type": "list", "children": [{"type": "nope"}]}}}"#,
             "/graph/template/children/0/type", "must be one of fetch, list, sequence, map"),
            (#"{"graph": {"type": "map", "items": [], "max_items": -1, "template": {\#(leaf)}}}"#,
             "/graph/max_items", "must be an integer from 0 to 10000"),
            (#"{"graph": {"type": "map", "items": [], "tolerated_failures": "1", "template": {\#(leaf)}}}"#,
             "/graph/tolerated_failures", "must be an integer"),
            (#"{"graph": {"type": "map", "items": [], "concurrency": 0, "template": {\#(leaf)}}}"#,
             "/graph/concurrency", "must be an integer from 1"),
            (#"{"graph": {"type": "map", "items": [], "fire_on_first_error": 1, "template": {\#(leaf)}}}"#,
             "/graph/fire_on_first_error", "must be a boolean"),
            (#"{"graph": {"type": "map", "items": [], "children": [], "template": {\#(leaf)}}}"#,
             "/graph/children", "unknown field for a map node"),
            (#"{"graph": {"type": "map", "items": [], "template": {"$ref": "/input"}}}"#,
             "/graph/template", "an expression cannot stand here"),
            (#"{"graph": {\#(leaf), "json": {"$ref": "/item"}}}"#, "/graph/json", "exists only inside a map template"),
            (#"{"graph": {"type": "map", "items": {"$ref": "/index"}, "template": {\#(leaf)}}}"#,
             "/graph/items", "exists only inside a map template"),
            (#"{"graph": {"type": "sequence", "children": [{"id": "m", "type": "map", "items": [], "template": {\#(leaf)}}, {"id": "m.0", \#(leaf)}]}}"#,
             "/graph/children/1/id", #"taken by the copies of the map "m""#),
            (#"{"graph": {"type": "map", "items": [], "template": {"type": "list", "children": [{"id": "1.2", \#(leaf)}]}}}"#,
             "/graph/template/children/0/id", "only of digits and dots"),
            (#"{"graph": {"type": "sequence", "children": [{"id": "m", "type": "map", "items": [], "template": {"id": "u", \#(leaf)}}, {"type": "fetch", "url": {"$ref": "/nodes/u/result/body"}}]}}"#,
             "/graph/children/1/url", #"part of the template of the map "m""#),
            (#"{"graph": {"type": "map", "items": [], "template": {"type": "list", "children": [{"id": "a", \#(leaf)}, {"type": "fetch", "url": {"$ref": "/nodes/a/result/body"}}]}}}"#,
             "/graph/template/children/1/url", "runs alongside"),
            (#"{"graph": {"id": "m", "type": "map", "items": [], "template": {"type": "fetch", "url": {"$ref": "/nodes/m/result"}}}}"#,
             "/graph/template/url", "contains node"),
            (#"{"graph": {"type": "sequence", "children": [{"type": "map", "items": {"$ref": "/nodes/later/result"}, "template": {\#(leaf)}}, {"id": "later", \#(leaf)}]}}"#,
             "/graph/children/0/items", "comes after"),
        ]
        for (body, path, fragment) in table {
            let found = refusalIssues(body)
            XCTAssertEqual(found.first?.pointer, path, body)
            XCTAssertTrue(found.first?.message.contains(fragment) == true, "\(body): \(found.first?.message ?? "none")")
        }
    }

    func testTheTemplateLeavesTheGraphAndKeepsItsIDsAsSuffixes() throws {
        let spec = try JobSpec.parse(
            try JSONValue.parse(
                #"""
                {"graph": {"type": "sequence", "children": [
                  {"id": "ids", "type": "fetch", "url": "http://h/ids"},
                  {"id": "users", "type": "map", "items": {"$ref": "/nodes/ids/result/body/ids"}, "max_items": 7,
                   "tolerated_failures": 2, "concurrency": 3,
                   "template": {"type": "sequence", "children": [
                     {"id": "u", "type": "fetch", "url": {"$concat": ["http://h/users/", {"$ref": "/item"}]}},
                     {"type": "fetch", "url": "http://h/x", "query": {"name": {"$ref": "/nodes/u/result/body/name"}}}]}},
                  {"type": "fetch", "url": "http://h/after"}]}}
                """#))
        XCTAssertEqual(spec.graph.nodes.map(\.id), ["root", "ids", "users", "root.2"], "template nodes are not run as such")
        guard case .map(let map) = spec.graph.nodes[2].kind else { return XCTFail("users is not a map") }
        XCTAssertEqual(map.template.nodes.map(\.id), ["", "u", "1"])
        XCTAssertEqual(map.localIDs, ["u": "u"])
        XCTAssertEqual(map.maxItems, 7)
        XCTAssertEqual(map.toleratedFailures, 2)
        XCTAssertEqual(map.options.concurrency, 3)
        guard case .ref(let ref) = map.items else { return XCTFail("items is not a $ref") }
        XCTAssertEqual(ref.pointer.text, "/nodes/ids/result/body/ids")
    }

    func testCopiesTakeTheirIDsAndItemsInOrder() throws {
        let spec = try JobSpec.parse(
            try JSONValue.parse(
                #"{"graph": {"id": "m", "type": "map", "items": ["a", "b"], "template": {"type": "list", "children": [{"type": "fetch", "url": "http://h/1"}, {"id": "x", "type": "fetch", "url": "http://h/2"}]}}}"#))
        guard case .map(let map) = spec.graph.nodes[0].kind else { return XCTFail("not a map") }
        var graph = spec.graph
        let (block, roots) = MapExpansion.copies(of: graph, map: 0, spec: map, items: ["a", "b"])
        graph.appendCopies(block, ofMap: 0, roots: roots)
        XCTAssertEqual(graph.nodes.map(\.id), ["m", "m.0", "m.0.0", "m.0.x", "m.1", "m.1.0", "m.1.x"])
        XCTAssertEqual(roots, [1, 4])
        XCTAssertEqual(graph.nodes[5].parent, 4)
        XCTAssertEqual(graph.nodes[4].parent, 0)
        XCTAssertEqual(graph.descendants(of: 1), 2..<4)
        XCTAssertEqual(graph.nodes[6].copy?.item, "b")
        XCTAssertEqual(graph.nodes[6].copy?.copyID(of: "x"), "m.1.x")
        XCTAssertEqual(graph.index(ofNodeID: "m.1.x"), 6)
    }
}

/// A `map` node run by the engine against the local upstream (API.md §7.1).
class MapEngineTests: EngineTestCase {
    func u(_ path: String) -> String { upstream.url(path) }

    func submit(_ engine: Engine, _ body: String) throws -> JobRecord {
        let json = try JSONValue.parse(body)
        switch try engine.submit(try JobSpec.parse(json), request: json, idempotencyKey: nil) {
        case .created(let job): return job
        case let other: throw UpstreamError("submit answered \(other)")
        }
    }

    func nodes(_ engine: Engine, _ id: String) throws -> [String: NodeRecord] {
        let list = try engine.nodes(jobID: id, includeResults: true) ?? []
        return Dictionary(uniqueKeysWithValues: list.map { ($0.id, $0) })
    }

    func counter(_ key: String) throws -> Int {
        try upstream.stats()["counters"]?[key]?.intValue ?? 0
    }

    /// A sequence: fetch `n` ids, then a map fetching each user with the given map fields.
    func idsThenUsers(_ n: Int, mapFields: String = "", userQuery: String = "") -> String {
        #"""
        {"graph": {"type": "sequence", "children": [
          {"id": "ids", "type": "fetch", "url": "\#(u("/ids?n=\(n)"))", "select": "/body/ids"},
          {"id": "users", "type": "map", "items": {"$ref": "/nodes/ids/result"}\#(mapFields),
           "template": {"type": "fetch", "url": {"$concat": ["\#(u("/users/"))", {"$ref": "/item"}]},
                        "query": {\#(userQuery)}, "select": "/body"}}]}}
        """#
    }

    func testAMapOverFetchedIDsSucceedsWithTheResultsInItemOrder() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(5, mapFields: #", "concurrency": 2, "fire_on_first_error": true"#)).id)
        XCTAssertEqual(job.state, .succeeded)
        let users = (1...5).map { JSONValue.object(["id": .int($0), "name": .string("user-\($0)")]) }
        XCTAssertEqual(job.result?[1], .array(users))
        XCTAssertEqual(job.progress.total, 3 + 5, "the copies count once the map expanded")
        let nodes = try nodes(engine, job.id)
        XCTAssertEqual(nodes["users.4"]?.parent, "users")
        XCTAssertEqual(nodes["users.4"]?.result, users[4])
        for id in 1...5 { XCTAssertEqual(try counter("users/\(id)"), 1) }
    }

    func testNodeListingsShowTheCopiesInTreeOrder() throws {
        let engine = try makeEngine()
        let job = try submit(engine, #"""
            {"graph": {"type": "sequence", "children": [
              {"id": "m", "type": "map", "items": [1, 2], "template": {"type": "list", "children": [
                {"type": "fetch", "url": "\#(u("/json"))"}]}},
              {"id": "after", "type": "fetch", "url": "\#(u("/json"))"}]}}
            """#)
        _ = try settled(engine, job.id)
        let ids = try engine.nodes(jobID: job.id, includeResults: false)?.map(\.id)
        XCTAssertEqual(ids, ["root", "m", "m.0", "m.0.0", "m.1", "m.1.0", "after"])
    }

    func testManyCopiesStartAChunkAtATimeAndAllSettle() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(600)).id, seconds: 60)
        XCTAssertEqual(job.state, .succeeded)
        guard case .array(let users)? = job.result?[1] else { return XCTFail("no array of users") }
        XCTAssertEqual(users.count, 600)
        XCTAssertEqual(users.last?["name"], "user-600")
    }

    func testAnEarlyFireCancelsTheCopiesNotStartedYet() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(600, mapFields: #", "fire_on_first_error": true"#,
                                                                    userQuery: #""fail": "1""#)).id, seconds: 60)
        XCTAssertEqual(job.error?.node, "users.0")
        let nodes = try nodes(engine, job.id)
        XCTAssertEqual(nodes["users.599"]?.state, .cancelled)
        XCTAssertEqual(job.progress.pending + job.progress.running, 0)
        XCTAssertEqual(try counter("users/600"), 0, "a copy of the last chunk started after the map had failed")
    }

    func testAnEmptyArraySucceedsWithAnEmptyArray() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(0)).id)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?[1], .array([]))
        XCTAssertEqual(job.progress.total, 3)
    }

    func testTooManyItemsFailsBeforeAnyCopyStarts() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(3, mapFields: #", "max_items": 2"#)).id)
        XCTAssertEqual(job.state, .failed)
        XCTAssertEqual(job.error?.kind, .tooManyItems)
        XCTAssertEqual(job.error?.node, "users")
        XCTAssertEqual(job.progress.total, 3)
        XCTAssertEqual(try counter("users/1"), 0)
    }

    func testTheNodeLimitBoundsTheCopies() throws {
        let engine = try makeEngine { $0.limits.maxNodes = 10 }
        let job = try settled(engine, try submit(engine, idsThenUsers(8)).id)
        XCTAssertEqual(job.error?.kind, .tooManyItems)
        XCTAssertTrue(job.error?.message.contains("the 7 that the limit of 10 nodes per job still allows") == true,
                      job.error?.message ?? "")
    }

    func testItemsThatAreNotAnArrayFailWithRefType() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, #"""
            {"input": {"ids": {"a": 1}}, "graph": {"type": "map", "items": {"$ref": "/input/ids"},
             "template": {"type": "fetch", "url": "\#(u("/json"))"}}}
            """#).id)
        XCTAssertEqual(job.error?.kind, .refType)
        XCTAssertTrue(job.error?.message.contains("must be an array, not an object") == true, job.error?.message ?? "")
    }

    func testFireOnFirstErrorFailsWithTheFailingCopysError() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(4, mapFields: #", "concurrency": 1, "fire_on_first_error": true"#,
                                                                    userQuery: #""fail": "2""#)).id)
        XCTAssertEqual(job.error?.kind, .httpStatus)
        XCTAssertEqual(job.error?.node, "users.1")
        let nodes = try nodes(engine, job.id)
        XCTAssertEqual(nodes["users.0"]?.state, .succeeded)
        XCTAssertEqual(nodes["users.2"]?.state, .cancelled)
        XCTAssertEqual(nodes["users.3"]?.state, .cancelled)
        XCTAssertEqual(try counter("users/3"), 0)
    }

    func testMoreFailuresThanToleratedFailTheMapAndCancelTheRest() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(6, mapFields: #", "concurrency": 1, "tolerated_failures": 1"#,
                                                                    userQuery: #""fail": "2,3,4""#)).id)
        XCTAssertEqual(job.error?.kind, .tooManyFailures)
        XCTAssertEqual(job.error?.node, "users")
        XCTAssertEqual(job.error?.errors?.map(\.node), ["users.1", "users.2"])
        let nodes = try nodes(engine, job.id)
        XCTAssertEqual(nodes["users.0"]?.state, .succeeded)
        XCTAssertEqual(nodes["users.3"]?.state, .cancelled)
        XCTAssertEqual(nodes["users.5"]?.state, .cancelled)
        XCTAssertEqual(try counter("users/4"), 0)
    }

    func testWithinToleratedFailuresTheMapSucceedsWithErrorEntries() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, idsThenUsers(3, mapFields: #", "tolerated_failures": 1, "consume_errors": true"#,
                                                                    userQuery: #""fail": "2""#)).id)
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(job.result?[1]?[1], .null)
        XCTAssertEqual(job.result?[1]?[2]?["name"], "user-3")
    }

    func testATemplateReadsItsOwnNodesItemAndIndexInTheSameCopy() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, #"""
            {"graph": {"id": "m", "type": "map", "items": [{"id": 7}, {"id": 9}],
             "template": {"type": "sequence", "children": [
               {"id": "u", "type": "fetch", "url": {"$concat": ["\#(u("/users/"))", {"$ref": "/item/id"}]}, "select": "/body"},
               {"id": "e", "type": "fetch", "url": "\#(u("/echo"))", "select": "/body/query",
                "query": {"name": {"$ref": "/nodes/u/result/name"}, "i": {"$ref": "/index"}}}]}}}
            """#).id)
        XCTAssertEqual(job.state, .succeeded, "\(String(describing: job.error))")
        XCTAssertEqual(job.result?[0]?[1], "name=user-7&i=0")
        XCTAssertEqual(job.result?[1]?[1], "name=user-9&i=1")
        let nodes = try nodes(engine, job.id)
        XCTAssertEqual(Set(nodes.keys), ["m", "m.0", "m.0.u", "m.0.e", "m.1", "m.1.u", "m.1.e"])
    }

    func testAMapInsideATemplateMapsTheOuterItem() throws {
        let engine = try makeEngine()
        let job = try settled(engine, try submit(engine, #"""
            {"graph": {"id": "outer", "type": "map", "items": [[1, 2], [3]],
             "template": {"id": "inner", "type": "map", "items": {"$ref": "/item"},
               "template": {"type": "fetch", "url": {"$concat": ["\#(u("/users/"))", {"$ref": "/item"}]},
                            "select": "/body/name"}}}}
            """#).id)
        XCTAssertEqual(job.state, .succeeded, "\(String(describing: job.error))")
        XCTAssertEqual(job.result, .array([.array(["user-1", "user-2"]), .array(["user-3"])]))
        let ids = try engine.nodes(jobID: job.id, includeResults: false)?.map(\.id)
        XCTAssertEqual(ids, ["outer", "outer.0", "outer.0.0", "outer.0.1", "outer.1", "outer.1.0"])
    }

    func testCancellingReachesTheCopies() throws {
        let engine = try makeEngine()
        let job = try submit(engine, idsThenUsers(4, mapFields: #", "concurrency": 2"#, userQuery: #""delay_ms": "5000""#))
        _ = try untilJob(engine, job.id) { try self.nodes(engine, job.id)["users.0"]?.state == .running }
        _ = try engine.answer("cancel") { done in engine.cancel(id: job.id) { done($0) } }.get()
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .cancelled)
        let nodes = try nodes(engine, job.id)
        for k in 0..<4 { XCTAssertEqual(nodes["users.\(k)"]?.state, .cancelled, "users.\(k)") }
    }

    func testCopiesCancelledAsTheyAreStoredAreStoredCancelled() throws {
        let engine = try makeEngine()
        let items = (0..<2000).map(String.init).joined(separator: ",")
        let job = try submit(engine, #"""
            {"graph": {"id": "m", "type": "map", "items": [\#(items)], "max_items": 2000,
             "template": {"type": "fetch", "url": "\#(u("/hang"))"}}}
            """#)
        _ = try engine.answer("cancel") { done in engine.cancel(id: job.id) { done($0) } }.get()
        XCTAssertEqual(try settled(engine, job.id).state, .cancelled)
        engine.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        // Read as stored, before any start could settle what was left over.
        let store = try makeStore()
        defer { store.close() }
        let stored = try store.nodes(jobID: job.id, includeResults: false)
        XCTAssertTrue(stored.allSatisfy { $0.state.isSettled }, "\(stored.filter { !$0.state.isSettled }.count) nodes stored unsettled")
    }

    /// On SQLite a copy's row is stored with its first change, so a server may stop with a map's items committed and
    /// no row of any copy: the restart makes the copies again from the items and runs them, and the map does not
    /// expand a second time (its items' row would be taken).
    func testARestartWithTheItemsStoredAndNoCopyRowRunsTheCopiesFromTheItems() throws {
        let body = #"""
            {"graph": {"id": "m", "type": "map", "items": [1, 2, 3],
             "template": {"type": "fetch", "url": {"$concat": ["\#(u("/users/"))", {"$ref": "/item"}]}, "select": "/body"}}}
            """#
        let request = try JSONValue.parse(body)
        let spec = try JobSpec.parse(request)
        let id = "01JMAPRESTART0000000000000"
        var progress = Progress()
        progress.total = 1
        progress.pending = 1
        let job = JobRecord(id: id, name: nil, state: .pending, createdAt: Timestamp.nowMs(), request: request, progress: progress)
        let copies = (0..<3).map { k in NodeRecord(jobID: id, id: "m.\(k)", parent: "m", position: 1 + k, type: "fetch") }
        let store = try makeStore()
        guard case .created = try store.createJob(
            job, nodes: spec.graph.pendingNodeRecords(jobID: id), idempotencyKey: nil, requestHash: nil)
        else { return XCTFail("the job was not created") }
        let expansion = MapExpansionRecord(jobID: id, nodeID: "m", firstPosition: 1, items: [1, 2, 3], nodes: copies)
        try waitForCompletion { done in store.expandMap(expansion, done) }.get()
        store.close()

        let engine = try makeEngine()
        let done = try settled(engine, id)
        XCTAssertEqual(done.state, .succeeded, "\(done.result ?? .null)")
        XCTAssertEqual(done.progress.total, 1 + 3)
        let users = (1...3).map { JSONValue.object(["id": .int($0), "name": .string("user-\($0)")]) }
        XCTAssertEqual(done.result, .array(users))
        for k in 1...3 { XCTAssertEqual(try counter("users/\(k)"), 1, "users/\(k)") }
    }

    func testARestartResumesTheCopiesWithoutFetchingSettledOnesAgain() throws {
        let body = idsThenUsers(6, mapFields: #", "concurrency": 1"#, userQuery: #""delay_ms": "150""#)
        var engine = try makeEngine()
        let job = try submit(engine, body)
        var settledBefore: [String] = []
        _ = try untilJob(engine, job.id) {
            settledBefore = try self.nodes(engine, job.id).values.filter { $0.id.hasPrefix("users.") && $0.state == .succeeded }.map(\.id)
            return settledBefore.count >= 2
        }
        XCTAssertGreaterThanOrEqual(settledBefore.count, 2)
        engine.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        engine = try makeEngine()
        let done = try settled(engine, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.progress.total, 3 + 6)
        let users = (1...6).map { JSONValue.object(["id": .int($0), "name": .string("user-\($0)")]) }
        XCTAssertEqual(done.result?[1], .array(users))
        for id in settledBefore {
            let k = Int(id.dropFirst("users.".count)) ?? -1
            XCTAssertEqual(try counter("users/\(k + 1)"), 1, "\(id) settled before the restart and was fetched again")
        }
    }
}

extension JSONValue {
    /// The element at `k` of an array.
    fileprivate subscript(_ k: Int) -> JSONValue? {
        if case .array(let elements) = self, elements.indices.contains(k) { return elements[k] }
        return nil
    }
}
