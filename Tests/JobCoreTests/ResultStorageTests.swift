import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// Results stored once (`ResultSource`): a parent's result refers to its children's, a fetch's body to the stored
/// response body. Every shape is run, then read back by a second engine on the same store (a restart: every read
/// comes from the rows), and must be exactly what the first engine had in memory.
class ResultStorageTests: EngineTestCase {
    func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    /// Runs each graph as a job on one engine, then checks every job's reads on a second engine of the same store
    /// against the first's; returns the second engine's nodes of each job by id.
    @discardableResult
    func roundTrip(_ graphs: [String], extra: String = "") throws -> [(job: JobRecord, nodes: [String: NodeRecord])] {
        let first = try makeEngine(dbName: "results.sqlite")
        var live: [(JobRecord, [NodeRecord])] = []
        for graph in graphs {
            let job = try submit(first, #"{"graph": \#(graph)\#(extra)}"#)
            let done = try settled(first, job.id)
            live.append((done, try XCTUnwrap(try first.nodes(jobID: job.id, includeResults: true))))
        }
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let second = try makeEngine(dbName: "results.sqlite")
        var out: [(job: JobRecord, nodes: [String: NodeRecord])] = []
        for (job, nodes) in live {
            let stored = try XCTUnwrap(try second.job(id: job.id))
            XCTAssertEqual(stored.result, job.result, "job \(job.id)'s result read back differs")
            try checkResultText(second, job)
            try checkNodeListText(second, job, nodes)
            XCTAssertEqual(stored.state, job.state)
            let storedNodes = try XCTUnwrap(try second.nodes(jobID: job.id, includeResults: true))
            XCTAssertEqual(storedNodes.count, nodes.count)
            for (a, b) in zip(storedNodes, nodes) {
                XCTAssertEqual(a.id, b.id)
                XCTAssertEqual(a.result, b.result, "node \(a.id)'s result in the listing read back differs")
                XCTAssertEqual(a.error, b.error)
                let one = try XCTUnwrap(try second.node(jobID: job.id, nodeID: a.id))
                XCTAssertEqual(one.result, b.result, "node \(a.id)'s result read alone differs")
            }
            if job.state == .succeeded { XCTAssertEqual(storedNodes.first?.result, job.result) }
            out.append((stored, Dictionary(uniqueKeysWithValues: storedNodes.map { ($0.id, $0) })))
        }
        return out
    }

    /// The job's result written as text from its rows (`JobStore.showStoredJob`) is the text of `job`'s result (as
    /// the engine that ran it had it); on SQLite, a settled job whose row refers to its root's result is shown so.
    func checkResultText(_ engine: Engine, _ job: JobRecord, file: StaticString = #filePath, line: UInt = #line) throws {
        let found = try engine.store.showStoredJob(id: job.id) { _, result -> [UInt8] in
            var out = AnswerSink(capacity: 0)
            try result.write(to: &out)
            // Written to a file, a few bytes at a time, the same bytes.
            var spooled = try AnswerSink.spooled(in: NSTemporaryDirectory(), flushBytes: 7)
            try result.write(to: &spooled)
            let answer = try spooled.finish()
            XCTAssertTrue(try answer.file?.bytes() == out.buffer, "written to a file, the result differs", file: file, line: line)
            return out.buffer
        }
        switch found {
        case .shown(let record, let bytes):
            XCTAssertEqual(record.resultSource, .child(0), file: file, line: line)
            XCTAssertEqual(
                String(decoding: bytes, as: UTF8.self), job.result?.text,
                "job \(job.id)'s result written from its rows differs", file: file, line: line)
        case .record(let record):
            XCTAssertEqual(record.result, job.result, file: file, line: line)
            if !Self.usesPostgres, record.state.isSettled {
                XCTAssertNotEqual(record.resultSource, .child(0), "not written from its rows", file: file, line: line)
            }
        case .notFound:
            XCTFail("job \(job.id) not found", file: file, line: line)
        }
    }

    /// Each node's result written as text from the rows (`JobStore.showStoredNodeList`) is the text of its result
    /// in `nodes` (as the engine that ran the job had them), and the nodes come in tree order; on SQLite, a settled
    /// job's nodes are shown so.
    func checkNodeListText(
        _ engine: Engine, _ job: JobRecord, _ nodes: [NodeRecord], file: StaticString = #filePath, line: UInt = #line
    ) throws {
        let found = try engine.store.showStoredNodeList(jobID: job.id) { list -> [(String, String)] in
            var sink = AnswerSink(capacity: 0)
            var starts: [Int] = []
            try list.write(to: &sink) { k, out in
                XCTAssertEqual(k, starts.count, "nodes in turn", file: file, line: line)
                out.append(contentsOf: "|".utf8)
                starts.append(out.count)
            }
            let out = sink.buffer
            // Written to a file, a few bytes at a time (each fetch's result copied from the file where a list
            // holding it wrote it), the same bytes.
            var spooled = try AnswerSink.spooled(in: NSTemporaryDirectory(), flushBytes: 7)
            try list.write(to: &spooled) { _, out in out.append(contentsOf: "|".utf8) }
            let answer = try spooled.finish()
            XCTAssertEqual(answer.count, out.count, file: file, line: line)
            XCTAssertTrue(try answer.file?.bytes() == out, "written to a file, the node list differs", file: file, line: line)
            let ends = starts.dropFirst().map { $0 - 1 } + [out.count]
            let shown = zip(starts, ends).enumerated().map { k, range in
                (list.nodes[k].id, String(decoding: out[range.0..<range.1], as: UTF8.self))
            }
            // What is reserved for the results holds them.
            XCTAssertGreaterThanOrEqual(list.resultBytes, shown.reduce(0) { $0 + $1.1.utf8.count }, file: file, line: line)
            return shown
        }
        switch found {
        case .shown(let shown):
            XCTAssertEqual(shown.map(\.0), nodes.map(\.id), "not in tree order", file: file, line: line)
            for ((id, text), node) in zip(shown, nodes) {
                XCTAssertEqual(
                    text, (node.result ?? .null).text, "node \(id)'s result written from the rows differs",
                    file: file, line: line)
            }
        case .nodes(let state, let stored):
            XCTAssertTrue(Self.usesPostgres || !state.isSettled, "not written from its rows", file: file, line: line)
            XCTAssertEqual(stored.inTreeOrder().map(\.result), nodes.map(\.result), file: file, line: line)
        case .notFound:
            XCTFail("job \(job.id) not found", file: file, line: line)
        }
    }

    /// `result_ref` of each node of the job, by node id (`nil`: written in full).
    func refs(_ jobID: String) throws -> [String: Int?] {
        let store = try makeStore(dbName: "results.sqlite")
        defer { store.close() }
        var out: [String: Int?] = [:]
        if let store = store as? SQLiteJobStore {
            try store.readers.with { db in
                let s = try db.prepare("SELECT id, result_ref FROM nodes WHERE job_id = ?1")
                defer { s.reset() }
                s.bind(1, jobID)
                while try s.step() { if let id = s.string(0) { out[id] = .some(s.optionalInt(1)) } }
            }
        } else if let url = databases["results.sqlite"] {
            let db = try PostgresConnection(url: url)
            defer { db.close() }
            let rows = try db.query("SELECT id, result_ref FROM nodes WHERE job_id = $1", [.text(jobID)])
            for row in rows.rows {
                let ref: Int? = row[1].flatMap { Int($0) }
                if let id = row[0] { out[id] = .some(ref) }
            }
        }
        return out
    }

    // MARK: - Shapes

    func testListsOfEveryBodyEncodingReadBackExactly() throws {
        let jobs = try roundTrip([
            """
            {"type":"list","children":[
              {"type":"fetch","url":\(u("/json?size=300"))},
              {"type":"fetch","url":\(u("/text"))},
              {"type":"fetch","url":\(u("/bytes/100"))},
              {"type":"fetch","url":\(u("/json?size=50")),"expect":"text"},
              {"type":"fetch","url":\(u("/text")),"expect":"bytes"}]}
            """,
        ])
        let (job, nodes) = jobs[0]
        XCTAssertEqual(job.state, .succeeded)
        XCTAssertEqual(nodes["root.0"]?.result?["body_encoding"], "json")
        XCTAssertEqual(nodes["root.1"]?.result?["body"], "hello, world")
        XCTAssertEqual(nodes["root.2"]?.result?["body_encoding"], "base64")
        XCTAssertEqual(nodes["root.3"]?.result?["body_encoding"], "text")
        XCTAssertEqual(nodes["root.4"]?.result?["body"], .string(Base64.encode(Array("hello, world".utf8))))
        let entries = (0..<5).map { nodes["root.\($0)"]?.result ?? .null }
        XCTAssertEqual(job.result, .array(entries))
        let refs = try refs(job.id)
        XCTAssertEqual(refs["root"], .some(ResultSource.children(consumeErrors: false).code))
        for k in 0..<5 { XCTAssertEqual(refs["root.\(k)"], .some(ResultSource.body.code), "root.\(k)") }
    }

    func testFailedChildrenWithAndWithoutConsumeErrors() throws {
        let jobs = try roundTrip([
            """
            {"type":"list","children":[
              {"type":"fetch","url":\(u("/json"))},
              {"type":"fetch","url":\(u("/status/500"))},
              {"type":"fetch","url":\(u("/invalid-json")),"expect":"json"}]}
            """,
            """
            {"type":"list","consume_errors":true,"children":[
              {"type":"fetch","url":\(u("/json"))},
              {"type":"fetch","url":\(u("/status/404"))}]}
            """,
            #"{"type":"fetch","url":\#(u("/status/503"))}"#,
        ])
        XCTAssertEqual(jobs[0].job.result?.arrayValue?[1]["error"]?["kind"], "http_status")
        XCTAssertEqual(jobs[0].job.result?.arrayValue?[2]["error"]?["kind"], "invalid_json")
        XCTAssertEqual(jobs[1].job.result?.arrayValue?[1], .null)
        XCTAssertEqual(try refs(jobs[1].job.id)["root"], .some(ResultSource.children(consumeErrors: true).code))
        XCTAssertEqual(jobs[2].job.state, .failed)
        XCTAssertEqual(jobs[2].nodes["root"]?.status, 503)
    }

    func testFireOnFirstResultRefersToTheChildThatWon() throws {
        let jobs = try roundTrip([
            """
            {"type":"list","fire_on_first_result":true,"children":[
              {"type":"fetch","url":\(u("/status/404"))},
              {"type":"fetch","url":\(u("/json?size=64"))},
              {"type":"fetch","url":\(u("/delay/300"))}]}
            """,
        ])
        let (job, nodes) = jobs[0]
        XCTAssertEqual(job.result, nodes["root.1"]?.result)
        XCTAssertEqual(try refs(job.id)["root"], .some(ResultSource.child(1).code))
    }

    func testSequenceContinuingAfterAFailure() throws {
        let jobs = try roundTrip([
            """
            {"type":"sequence","continue_on_error":true,"children":[
              {"type":"fetch","url":\(u("/json"))},
              {"type":"fetch","url":\(u("/status/500"))},
              {"type":"fetch","url":\(u("/text"))}]}
            """,
        ])
        XCTAssertEqual(jobs[0].job.result?.arrayValue?.count, 3)
        XCTAssertEqual(try refs(jobs[0].job.id)["root"], .some(ResultSource.children(consumeErrors: false).code))
    }

    func testMapCopiesUnderTheirMap() throws {
        let jobs = try roundTrip([
            """
            {"type":"list","children":[
              {"id":"m","type":"map","items":["1","2","3"],
               "template":{"type":"fetch","url":{"$concat":[\(u("/json?size=")),{"$ref":"/item"},"0"]}}},
              {"id":"f","type":"map","items":["a","b"],"fire_on_first_result":true,
               "template":{"type":"list","children":[{"type":"fetch","url":\(u("/text"))}]}}]}
            """,
        ])
        let (job, nodes) = jobs[0]
        XCTAssertEqual(nodes["m"]?.result?.arrayValue?.count, 3)
        XCTAssertEqual(nodes["m"]?.result?.arrayValue?[2]["bytes"], 30)
        XCTAssertEqual(job.result?.arrayValue?[0], nodes["m"]?.result)
        let refs = try refs(job.id)
        XCTAssertEqual(refs["m"], .some(ResultSource.children(consumeErrors: false).code))
        XCTAssertNotNil(refs["f"] ?? nil)
    }

    func testListsNestedThreeDeep() throws {
        let leaf = #"{"type":"fetch","url":\#(u("/json?size=200"))}"#
        let inner = #"{"type":"list","children":[\#(leaf),\#(leaf)]}"#
        let middle = #"{"type":"list","children":[\#(inner),\#(inner)]}"#
        let jobs = try roundTrip([#"{"type":"list","children":[\#(middle),\#(middle)]}"#])
        let (job, nodes) = jobs[0]
        XCTAssertEqual(job.result?.arrayValue?[1].arrayValue?[0].arrayValue?[1], nodes["root.1.0.1"]?.result)
        let refs = try refs(job.id)
        for id in ["root", "root.0", "root.1.0"] {
            XCTAssertEqual(refs[id], .some(ResultSource.children(consumeErrors: false).code), id)
        }
    }

    func testSelectAndRecoverAreWrittenAsTheyAre() throws {
        let jobs = try roundTrip([
            """
            {"type":"list","children":[
              {"type":"fetch","url":\(u("/json?size=40")),"select":"/body"},
              {"type":"fetch","url":\(u("/status/500")),"recover":{"fallback":true}},
              {"type":"list","select":"/0","children":[{"type":"fetch","url":\(u("/text"))}]}]}
            """,
        ])
        let (job, nodes) = jobs[0]
        XCTAssertEqual(nodes["root.1"]?.result, .object(["fallback": true]))
        XCTAssertEqual(nodes["root.1"]?.recovered, true)
        XCTAssertEqual(nodes["root.2"]?.result, nodes["root.2.0"]?.result)
        let refs = try refs(job.id)
        XCTAssertEqual(refs["root.0"], .some(nil))
        XCTAssertEqual(refs["root.1"], .some(nil))
        XCTAssertEqual(refs["root.2"], .some(nil))
        // The list's entries are its children's (selected, recovered) results: it still refers to them.
        XCTAssertEqual(refs["root"], .some(ResultSource.children(consumeErrors: false).code))

        // A damaged row of a result written in full fails the read, written from the rows or read as values alike.
        try executeRaw(
            "UPDATE nodes SET result = '{\"fallback\":' WHERE job_id = '\(job.id)' AND id = 'root.1'", dbName: "results.sqlite")
        let store = try XCTUnwrap(engines.last?.store)
        XCTAssertThrowsError(try store.showStoredJob(id: job.id) { _, result in
            var out = AnswerSink(capacity: 0)
            try result.write(to: &out)
        }) {
            XCTAssertEqual(($0 as? StoreError)?.kind, .corrupt)
        }
        XCTAssertThrowsError(try store.jobWithoutRequest(id: job.id)) {
            XCTAssertEqual(($0 as? StoreError)?.kind, .corrupt)
        }
    }

    /// A job still running when the server stops resumes with its settled nodes' whole results: a parent that
    /// settles after the restart has them, and so do `$ref`s to them.
    func testResumedJobGetsTheAssembledResultsOfSettledNodes() throws {
        let first = try makeEngine(dbName: "results.sqlite")
        let job = try submit(first, """
            {"graph":{"type":"sequence","children":[
              {"id":"a","type":"list","children":[{"type":"fetch","url":\(u("/json?size=120"))}]},
              {"type":"fetch","url":\(u("/delay/800"))},
              {"type":"fetch","method":"POST","url":\(u("/echo")),"json":{"$ref":"/nodes/a/result/0/body"}}]}}
            """)
        _ = try untilJob(first, job.id) { try first.node(jobID: job.id, nodeID: "root.1")?.state == .running }
        let before = try XCTUnwrap(try first.node(jobID: job.id, nodeID: "a"))
        XCTAssertEqual(before.state, .succeeded)
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let second = try makeEngine(dbName: "results.sqlite")
        let done = try settled(second, job.id)
        XCTAssertEqual(done.state, .succeeded)
        XCTAssertEqual(done.result?.arrayValue?[0], before.result)
        let echoed = try JSONValue.parse(done.result?.arrayValue?[2]["body"]?["body"]?.stringValue ?? "")
        XCTAssertEqual(echoed, before.result?.arrayValue?[0]["body"])
    }

    /// An idempotent resubmission answers the stored job with its whole result, and a retry keeps its succeeded
    /// nodes' whole results (read back from the rows they refer to) for the parent that settles again.
    func testResubmissionAndRetryReadAssembledResults() throws {
        let first = try makeEngine(dbName: "results.sqlite")
        let plain = #"{"graph":{"type":"list","children":[{"type":"fetch","url":\#(u("/json?size=90"))}]}}"#
        let done = try settled(first, try submit(first, plain, key: "again").id)
        XCTAssertEqual(done.state, .succeeded)
        let failing = try submit(first, """
            {"graph":{"type":"sequence","children":[
              {"id":"a","type":"list","children":[{"type":"fetch","url":\(u("/json?size=80"))},{"type":"fetch","url":\(u("/text"))}]},
              {"type":"fetch","url":\(u("/count/retry?fail=1"))}]}}
            """)
        XCTAssertEqual(try settled(first, failing.id).state, .failed)
        let a = try XCTUnwrap(try first.node(jobID: failing.id, nodeID: "a"))
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()

        let second = try makeEngine(dbName: "results.sqlite")
        let existing = try submit(second, plain, key: "again")
        XCTAssertEqual(existing.id, done.id)
        XCTAssertEqual(existing.result, done.result)
        guard case .retrying = try second.answer("retry", { finished in second.retry(id: failing.id) { finished($0) } }).get() else {
            return XCTFail("the failed job was not retried")
        }
        let retried = try settled(second, failing.id)
        XCTAssertEqual(retried.state, .succeeded)
        XCTAssertEqual(retried.result?.arrayValue?[0], a.result)
        XCTAssertEqual(retried.result?.arrayValue?[1]["body"]?["count"], 2)
        second.shutdown(gracePeriodMs: 2000)
        engines.removeAll()

        let third = try makeEngine(dbName: "results.sqlite")
        XCTAssertEqual(try third.job(id: failing.id)?.result, retried.result)
    }

    // MARK: - Bytes

    /// Bytes stored for lists of 1 KiB JSON fetches, one level and three levels deep: the result rows hold
    /// no response twice, so the bytes per fetch do not grow with depth and stay within 1.5× the body plus a
    /// fixed overhead per node.
    func testStoredBytesStayNearTheFetchedBytesAtAnyDepth() throws {
        let leaf = #"{"type":"fetch","url":\#(u("/json?size=1024"))}"#
        func list(_ children: [String]) -> String { #"{"type":"list","children":[\#(children.joined(separator: ","))]}"# }
        let flat = list(Array(repeating: leaf, count: 64))
        let deep = list(Array(repeating: list(Array(repeating: list(Array(repeating: leaf, count: 4)), count: 4)), count: 4))
        let first = try makeEngine(dbName: "results.sqlite")
        var ids: [String] = []
        for graph in [flat, deep] {
            let job = try submit(first, #"{"graph": \#(graph)}"#)
            XCTAssertEqual(try settled(first, job.id).state, .succeeded)
            ids.append(job.id)
        }
        first.shutdown(gracePeriodMs: 2000)
        engines.removeAll()
        let store = try makeStore(dbName: "results.sqlite")
        defer { store.close() }
        for (id, fetches, lists) in [(ids[0], 64, 1), (ids[1], 64, 21)] {
            let (results, bodies) = try storedBytes(store, jobID: id)
            // The result columns hold the fetches' status, headers and the like, never a body: well under 1 KiB each.
            XCTAssertEqual(bodies, fetches * 1024)
            XCTAssertLessThan(results, (fetches + lists) * 512, "job \(id): \(results) bytes of results for \(bodies) of bodies")
            XCTAssertLessThanOrEqual(Double(results + bodies), 1.5 * Double(bodies) + Double((fetches + lists) * 512))
        }
    }

    /// Bytes in the `result` columns of a job's rows and in its stored bodies.
    func storedBytes(_ store: JobStore, jobID: String) throws -> (results: Int, bodies: Int) {
        let results = "SELECT coalesce(sum(length(result)), 0) FROM (SELECT result FROM jobs WHERE id = $1 "
            + "UNION ALL SELECT result FROM nodes WHERE job_id = $1) r"
        let bodies = "SELECT coalesce(sum(length(bytes)), 0) FROM bodies WHERE job_id = $1"
        if let store = store as? SQLiteJobStore {
            return try store.readers.with { db in
                func one(_ sql: String) throws -> Int {
                    let s = try db.prepare(sql.replacingOccurrences(of: "$1", with: "?1"))
                    defer { s.reset() }
                    s.bind(1, jobID)
                    return try s.step() ? s.int(0) : -1
                }
                return (try one(results), try one(bodies))
            }
        }
        let url = try XCTUnwrap(databases["results.sqlite"])
        let db = try PostgresConnection(url: url)
        defer { db.close() }
        func one(_ sql: String) throws -> Int {
            let rows = try db.query(sql.replacingOccurrences(of: "length(", with: "octet_length("), [.text(jobID)])
            return rows.rows.first?.first.flatMap { $0.flatMap { Int($0) } } ?? -1
        }
        return (try one(results), try one(bodies))
    }

    // MARK: - Assembly alone

    /// Rows as a store reads them: what `ResultAssembly.stored` writes, and `resultSource` from the ref.
    private func asStored(_ nodes: [NodeRecord]) -> [NodeRecord] {
        nodes.map { node in
            var row = node
            let stored = ResultAssembly.stored(node.result, node.resultSource)
            row.result = stored.result
            row.resultSource = stored.ref.flatMap { try? ResultSource(code: $0) }
            return row
        }
    }

    func testAssemblyRebuildsWhatWasStoredAndRefusesMissingRows() throws {
        let body: [UInt8] = Array(#"{"a":[1,2.50,"x"]}"#.utf8)
        let parsed = try JSONValue.parse(body)
        func fetch(_ id: String, _ parent: String, _ position: Int) -> NodeRecord {
            var node = NodeRecord(jobID: "j", id: id, parent: parent, position: position, type: "fetch", state: .succeeded)
            node.result = .object([
                JSONMember("status", 200), JSONMember("body", parsed),
                JSONMember("body_encoding", "json"), JSONMember("bytes", .int(body.count)),
            ])
            node.resultSource = .body
            return node
        }
        var failed = NodeRecord(jobID: "j", id: "f", parent: "l", position: 3, type: "fetch", state: .failed)
        failed.error = NodeError(.httpStatus, "GET / answered 500", node: "f")
        var list = NodeRecord(jobID: "j", id: "l", parent: "root", position: 1, type: "list", state: .succeeded)
        let a = fetch("a", "l", 2)
        list.result = .array([a.result ?? .null, .object([JSONMember("error", failed.error?.json ?? .null)])])
        list.resultSource = .children(consumeErrors: false)
        var root = NodeRecord(jobID: "j", id: "root", parent: nil, position: 0, type: "list", state: .succeeded)
        root.result = list.result
        root.resultSource = .child(0)
        let nodes = [root, list, a, failed]
        var rows = asStored(nodes)
        XCTAssertNil(rows[0].result)
        XCTAssertEqual(rows[2].result?["body"], .null)
        try ResultAssembly.assemble(&rows) { ids in Dictionary(uniqueKeysWithValues: ids.map { ($0, body) }) }
        XCTAssertEqual(rows, nodes)

        var one = asStored(nodes)
        try ResultAssembly.assemble(&one, target: 1) { ids in Dictionary(uniqueKeysWithValues: ids.map { ($0, body) }) }
        XCTAssertEqual(one[1], nodes[1])
        XCTAssertNil(one[0].result, "outside the target's subtree nothing is assembled")

        var noBody = asStored(nodes)
        XCTAssertThrowsError(try ResultAssembly.assemble(&noBody) { _ in [:] }) {
            XCTAssertEqual(($0 as? StoreError)?.kind, .corrupt)
        }
        var noChild = asStored(nodes)
        noChild.remove(at: 1)
        XCTAssertThrowsError(try ResultAssembly.assemble(&noChild) { ids in Dictionary(uniqueKeysWithValues: ids.map { ($0, body) }) })
    }

    /// A list of more fetches than `bodyBatch` has its bodies asked for a batch at a time, each asked for once, and
    /// every one filled in: the raw bodies of one batch are held at once, not the job's.
    func testAssemblyAsksForBodiesABatchAtATime() throws {
        let n = ResultAssembly.bodyBatch * 2 + 1
        var root = NodeRecord(jobID: "j", id: "root", parent: nil, position: 0, type: "list", state: .succeeded)
        root.resultSource = .children(consumeErrors: false)
        var nodes = [root]
        for k in 1...n {
            var node = NodeRecord(jobID: "j", id: "f\(k)", parent: "root", position: k, type: "fetch", state: .succeeded)
            node.result = .object([
                JSONMember("status", 200), JSONMember("body", .string("body \(k)")), JSONMember("body_encoding", "text"),
            ])
            node.resultSource = .body
            nodes.append(node)
        }
        nodes[0].result = .array(nodes.dropFirst().map { $0.result ?? .null })
        var rows = asStored(nodes)
        var asked: [[String]] = []
        try ResultAssembly.assemble(&rows) { ids in
            asked.append(ids)
            return Dictionary(uniqueKeysWithValues: ids.map { ($0, Array("body \($0.dropFirst())".utf8)) })
        }
        XCTAssertEqual(asked.map(\.count), [ResultAssembly.bodyBatch, ResultAssembly.bodyBatch, 1])
        XCTAssertTrue(asked.flatMap { $0 } == nodes.dropFirst().map(\.id), "each body asked for once, in order")
        XCTAssertTrue(rows == nodes, "every body filled in")
    }
}

final class PostgresResultStorageTests: ResultStorageTests {
    override class var usesPostgres: Bool { true }
    func testTheStoreIsPostgres() throws { try checkTheStoreIsPostgres() }
}
