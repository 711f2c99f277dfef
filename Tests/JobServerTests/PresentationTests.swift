import HTTPServer
import JobCore
import XCTest

@testable import JobServer

final class PresentationTests: XCTestCase {
    // 2026-12-02T08:11:28.123Z
    private let t0: Int64 = 1_796_199_088_123

    func testTimestampFixtureIsWhatItSays() {
        XCTAssertEqual(Timestamp.format(t0), "2026-12-02T08:11:28.123Z")
    }

    func testRunningJobHasEveryFieldInDocumentedOrder() {
        var progress = JobCore.Progress()
        progress.total = 3
        progress.running = 1
        progress.succeeded = 1
        progress.pending = 1
        let job = JobRecord(
            id: "01JEXAMPLE", name: "profile-and-messages", state: .running, createdAt: t0, startedAt: t0 + 1,
            request: .object([:]), metadata: .object(["requested_by": "nightly-sync"]), version: 5, progress: progress)
        XCTAssertEqual(
            Presentation.job(job).text,
            #"{"id":"01JEXAMPLE","name":"profile-and-messages","state":"running","#
                + #""created_at":"2026-12-02T08:11:28.123Z","started_at":"2026-12-02T08:11:28.124Z","finished_at":null,"#
                + #""progress":{"total":3,"pending":1,"running":1,"succeeded":1,"failed":0,"cancelled":0,"skipped":0,"#
                + #""done":1,"percent":33.3},"result":null,"error":null,"metadata":{"requested_by":"nightly-sync"},"#
                + #""attempt":1,"version":5}"#)
    }

    func testSettledJobShowsResultOrErrorAndNullName() {
        var progress = JobCore.Progress()
        progress.total = 1
        progress.succeeded = 1
        var job = JobRecord(
            id: "j", state: .succeeded, createdAt: t0, startedAt: t0, finishedAt: t0, request: .null,
            result: .object(["status": 200]), version: 3, progress: progress)
        XCTAssertEqual(
            Presentation.job(job).text,
            #"{"id":"j","name":null,"state":"succeeded","created_at":"2026-12-02T08:11:28.123Z","#
                + #""started_at":"2026-12-02T08:11:28.123Z","finished_at":"2026-12-02T08:11:28.123Z","#
                + #""progress":{"total":1,"pending":0,"running":0,"succeeded":1,"failed":0,"cancelled":0,"skipped":0,"#
                + #""done":1,"percent":100.0},"result":{"status":200},"error":null,"metadata":null,"attempt":1,"version":3}"#)
        job.state = .failed
        job.result = nil
        job.error = NodeError(.httpStatus, "GET http://x answered 503", node: "root.1", status: 503)
        let value = Presentation.job(job)
        XCTAssertEqual(value["result"], .null)
        XCTAssertEqual(value["error"]?.text, #"{"kind":"http_status","message":"GET http://x answered 503","node":"root.1","status":503}"#)
    }

    func testSchedulingFieldsStandBeforeTheVersion() {
        var job = JobRecord(id: "j", createdAt: t0, request: .null, version: 2)
        job.notBefore = t0
        job.concurrencyKey = "nightly"
        job.concurrencyLimit = 3
        job.queuePosition = 4
        job.attempt = 2
        let keys = Presentation.job(job).objectValue?.map(\.key).suffix(6)
        XCTAssertEqual(keys.map(Array.init), ["not_before", "concurrency_key", "concurrency_limit", "queue_position", "attempt", "version"])
        XCTAssertEqual(Presentation.job(job)["not_before"], "2026-12-02T08:11:28.123Z")
    }

    func testListedJobHasNoResultField() {
        let job = JobRecord(id: "j", createdAt: t0, request: .null, result: .string("big"))
        let list = Presentation.jobList([job], nextCursor: "next")
        let keys = list["jobs"]?.arrayValue?.first?.objectValue?.map(\.key)
        XCTAssertEqual(keys, ["id", "name", "state", "created_at", "started_at", "finished_at", "progress", "error",
                              "metadata", "attempt", "version"])
        XCTAssertEqual(list["next_cursor"], "next")
        XCTAssertEqual(Presentation.jobList([], nextCursor: nil).text, #"{"jobs":[],"next_cursor":null}"#)
    }

    func testPercentHasOneDecimal() {
        func percent(_ done: Int, of total: Int) -> String {
            var p = JobCore.Progress()
            p.total = total
            p.succeeded = done
            return Presentation.percent(p).text
        }
        XCTAssertEqual(percent(0, of: 0), "0.0")
        XCTAssertEqual(percent(0, of: 3), "0.0")
        XCTAssertEqual(percent(1, of: 3), "33.3")
        XCTAssertEqual(percent(2, of: 3), "66.7")
        XCTAssertEqual(percent(3, of: 3), "100.0")
        XCTAssertEqual(percent(1, of: 8), "12.5")
        XCTAssertEqual(percent(1, of: 10_000), "0.0")
    }

    func testNodeHasEveryFieldInDocumentedOrder() {
        let node = NodeRecord(
            jobID: "j", id: "root.1", parent: "root", position: 2, type: "fetch", state: .failed, attempts: 3,
            startedAt: t0, finishedAt: t0 + 10, elapsedMs: 10, status: 503,
            error: NodeError(.httpStatus, "503", node: "root.1", status: 503), recovered: false,
            result: .string("r"))
        XCTAssertEqual(
            Presentation.node(node, includeResult: false).text,
            #"{"id":"root.1","parent":"root","type":"fetch","state":"failed","attempts":3,"#
                + #""started_at":"2026-12-02T08:11:28.123Z","finished_at":"2026-12-02T08:11:28.133Z","elapsed_ms":10,"#
                + #""status":503,"error":{"kind":"http_status","message":"503","node":"root.1","status":503},"#
                + #""recovered":false}"#)
        let withResult = Presentation.node(node, includeResult: true)
        XCTAssertEqual(withResult.objectValue?.last?.key, "result")
        XCTAssertEqual(withResult["result"], "r")
    }

    func testUnstartedRootNodeHasNulls() {
        let node = NodeRecord(jobID: "j", id: "root", parent: nil, position: 0, type: "list")
        XCTAssertEqual(
            Presentation.nodeList([node], includeResult: true).text,
            #"{"nodes":[{"id":"root","parent":null,"type":"list","state":"pending","attempts":0,"started_at":null,"#
                + #""finished_at":null,"elapsed_ms":null,"status":null,"error":null,"recovered":false,"result":null}]}"#)
    }

    /// The node list without results, written a node at a time into memory or a temporary file (its 1 MiB buffer
    /// flushed for 10,000 nodes, 2 MB), is byte for byte the list made as values.
    func testANodeListWrittenANodeAtATimeIsTheListMadeAsValues() throws {
        let failed = NodeRecord(
            jobID: "j", id: "root.1", parent: "root", position: 1, type: "fetch", state: .failed, attempts: 3,
            startedAt: t0, finishedAt: t0 + 10, elapsedMs: 10, status: 503,
            error: NodeError(.httpStatus, "503 \"quoted\" é", node: "root.1", status: 503), recovered: false,
            result: .string("r"))
        let root = NodeRecord(jobID: "j", id: "root", parent: nil, position: 0, type: "list")
        let many = (0..<10_000).map { NodeRecord(jobID: "j", id: "n\($0)", parent: "root", position: $0 + 1, type: "fetch") }
        let rows: [(what: String, nodes: [NodeRecord])] = [
            ("no nodes", []), ("one node", [root]), ("a failed node", [root, failed]), ("10,001 nodes", [root] + many),
        ]
        let spools = [
            ("in memory", AnswerSpool(directory: nil, thresholdBytes: 0)),
            ("to a file", AnswerSpool(directory: NSTemporaryDirectory(), thresholdBytes: 0)),
        ]
        for row in rows {
            for (where_, spool) in spools {
                let answer = try Presentation.nodeListWithoutResultsAnswer(row.nodes, spool: spool)
                XCTAssertEqual(answer.file != nil, spool.directory != nil, "\(row.what) \(where_)")
                XCTAssertEqual(
                    String(decoding: try answer.file?.bytes() ?? answer.bytes, as: UTF8.self),
                    Presentation.nodeList(row.nodes, includeResult: false).text, "\(row.what) \(where_)")
            }
        }
    }

    func testErrorBody() {
        XCTAssertEqual(
            Presentation.error(code: "not_found", message: "no job").text,
            #"{"error":{"code":"not_found","message":"no job"}}"#)
    }

    func testInvalidGraphNamesFirstIssueAndListsAll() throws {
        let response = App.invalidGraph([
            (pointer: "/graph/children/2/url", message: "scheme must be http or https"),
            (pointer: "/name", message: "at most 200 characters"),
        ])
        XCTAssertEqual(response.status, 422)
        XCTAssertEqual(response.headers["Content-Type"], "application/json")
        XCTAssertEqual(
            String(decoding: response.body, as: UTF8.self),
            #"{"error":{"code":"invalid_graph","message":"graph.children[2].url: scheme must be http or https","#
                + #""path":"/graph/children/2/url","details":[{"path":"/graph/children/2/url","#
                + #""message":"scheme must be http or https"},{"path":"/name","message":"at most 200 characters"}]}}"#)
    }

    func testDottedPath() {
        XCTAssertEqual(Presentation.dottedPath(""), "")
        XCTAssertEqual(Presentation.dottedPath("/graph"), "graph")
        XCTAssertEqual(Presentation.dottedPath("/graph/children/0/children/12/headers/a~1b~0c"),
                       "graph.children[0].children[12].headers.a/b~c")
        XCTAssertEqual(Presentation.dottedPath("/0"), "0")
    }
}
