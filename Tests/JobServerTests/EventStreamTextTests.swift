import XCTest
@testable import JobCore
@testable import JobServer

/// The text of `GET /v1/jobs/{id}/events` (server-sent events) and `notify` on submissions and jobs.
final class EventStreamTextTests: XCTestCase {
    private func job(state: NodeState, version: Int64) -> JobRecord {
        var job = JobRecord(id: "01JOB", state: state, createdAt: 0, request: .null, version: version)
        job.result = .string("not shown")
        return job
    }

    func testNodeEventsThenTheJobEachWithTheVersionAsID() throws {
        var node = NodeRecord(jobID: "01JOB", id: "root.0", parent: "root", position: 1, type: "fetch", state: .succeeded)
        node.result = nil
        let batch = JobEventBatch(job: job(state: .succeeded, version: 7), nodes: [node], jobStateChanged: true, isLast: true)
        let text = String(decoding: EventStreamText.render(batch), as: UTF8.self)
        let events = text.components(separatedBy: "\n\n").filter { !$0.isEmpty }
        XCTAssertTrue(text.hasSuffix("\n\n"))
        XCTAssertEqual(events.count, 2)
        let nodeLines = events[0].components(separatedBy: "\n")
        XCTAssertEqual(Array(nodeLines.prefix(2)), ["event: node", "id: 7"])
        XCTAssertTrue(nodeLines[2].hasPrefix("data: {\"id\":\"root.0\""), nodeLines[2])
        let jobLines = events[1].components(separatedBy: "\n")
        XCTAssertEqual(Array(jobLines.prefix(2)), ["event: job", "id: 7"])
        let data = try JSONValue.parse(String(jobLines[2].dropFirst("data: ".count)))
        XCTAssertEqual(data["state"]?.stringValue, "succeeded")
        XCTAssertNil(data["result"], "events carry no result")
        XCTAssertEqual(nodeLines.count, 3, "one data line: compact JSON holds no line break")
    }

    func testNodeChangesAloneSendNoJobEvent() {
        let node = NodeRecord(jobID: "01JOB", id: "root", parent: nil, position: 0, type: "list", state: .running)
        let batch = JobEventBatch(job: job(state: .running, version: 3), nodes: [node], jobStateChanged: false, isLast: false)
        let text = String(decoding: EventStreamText.render(batch), as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("event: node\nid: 3\n"))
        XCTAssertFalse(text.contains("event: job"))
        XCTAssertEqual(String(decoding: EventStreamText.keepAlive, as: UTF8.self), ": keep-alive\n\n")
    }

    func testBatchIsRenderedOnceForAllStreams() {
        let batch = JobEventBatch(job: job(state: .running, version: 2), nodes: [], jobStateChanged: true, isLast: false)
        var calls = 0
        let first = batch.rendered { calls += 1; return EventStreamText.render($0) }
        let second = batch.rendered { calls += 1; return EventStreamText.render($0) }
        XCTAssertEqual(first, second)
        XCTAssertEqual(calls, 1)
    }

    func testNotifyIsValidatedAtSubmitWithItsPath() throws {
        let good = try JobSpec.parse(try JSONValue.parse(#"{"graph":{"type":"fetch","url":"http://a/"},"notify":{"url":"https://hooks.local/x"}}"#))
        XCTAssertEqual(good.notify, NotifyTarget(url: "https://hooks.local/x"))
        let cases: [(String, String)] = [
            (#"{"notify":{"url":"ftp://x/"}}"#, "/notify/url"),
            (#"{"notify":{"url":5}}"#, "/notify/url"),
            (#"{"notify":{}}"#, "/notify/url"),
            (#"{"notify":{"url":"http://a/","secret":"x"}}"#, "/notify/secret"),
            (#"{"notify":[]}"#, "/notify"),
        ]
        for (extra, pointer) in cases {
            let body = #"{"graph":{"type":"fetch","url":"http://a/"},"# + extra.dropFirst()
            XCTAssertThrowsError(try JobSpec.parse(try JSONValue.parse(body)), extra) { error in
                XCTAssertEqual((error as? ValidationError)?.issues.first?.pointer, pointer, extra)
            }
        }
    }

    func testNotifyOnTheJobObject() {
        var live = job(state: .running, version: 2)
        XCTAssertNil(Presentation.job(live)["notify"], "no notify asked for: no field")
        live.request = .object([JSONMember("notify", .object([JSONMember("url", .string("http://h/"))]))])
        XCTAssertEqual(Presentation.job(live)["notify"]?["state"]?.stringValue, "pending")
        var stored = job(state: .succeeded, version: 5)
        stored.notify = NotifyStatus(state: "delivered", attempts: 3, lastStatus: 200)
        let shown = Presentation.job(stored)["notify"]
        XCTAssertEqual(shown?["attempts"], .int(3))
        XCTAssertEqual(shown?["last_status"], .int(200))
    }
}
