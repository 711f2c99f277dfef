import Foundation
import HTTPServer
import JobCore
import TestSupport
import XCTest

@testable import JobServer

/// The routes of API.md §2 and the errors of §3, called without sockets over a real engine.
class AppRouteTests: XCTestCase {
    private var upstream: Upstream!
    private var harness: AppHarness!

    override func setUpWithError() throws {
        upstream = try Upstream.start()
        harness = try AppHarness()
    }

    override func tearDown() {
        harness?.shutdown()
        upstream?.stop()
        harness = nil
        upstream = nil
    }

    private func restart(_ configure: (inout ServerConfig) -> Void) throws {
        harness.shutdown()
        harness = try AppHarness(configure)
    }

    // MARK: Submitting

    func testSubmitAnswers201WithLocationAndTheJob() throws {
        let answer = harness.call(.submitJob, body: fetchJob(upstream.url("/json"), name: "one"))
        XCTAssertEqual(answer.status, 201, answer.text)
        let job = try XCTUnwrap(answer.json)
        let id = try XCTUnwrap(job["id"]?.stringValue)
        XCTAssertEqual(answer.headers["Location"], "/v1/jobs/\(id)")
        XCTAssertEqual(answer.headers["Content-Type"], "application/json")
        XCTAssertEqual(
            job.objectValue?.map(\.key),
            ["id", "name", "state", "created_at", "started_at", "finished_at", "progress", "result", "error",
             "metadata", "attempt", "version"])
        XCTAssertEqual(job["name"], "one")
        XCTAssertEqual(job["progress"]?["total"], 1)
        let fetched = harness.call(.getJob, id: id)
        XCTAssertEqual(fetched.status, 200)
        XCTAssertEqual(fetched.json?["id"]?.stringValue, id)
    }

    func testSubmitAcceptsJSONWithUTF8Charset() {
        let answer = harness.call(
            .submitJob, headers: [("Content-Type", "application/json; charset=utf-8")], body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(answer.status, 201, answer.text)
    }

    func testMetadataIsEchoedUnchanged() {
        let body = #"{"graph":{"type":"fetch","url":"\#(upstream.url("/json"))"},"metadata":{"b":1.50,"a":[true,null]}}"#
        let answer = harness.call(.submitJob, body: body)
        XCTAssertEqual(answer.status, 201, answer.text)
        XCTAssertEqual(answer.json?["metadata"]?.text, #"{"b":1.50,"a":[true,null]}"#)
    }

    func testBodyThatIsNotJSONMediaTypeIs415() {
        let plain = harness.call(.submitJob, headers: [("Content-Type", "text/plain")], body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(plain.status, 415)
        XCTAssertEqual(plain.errorCode, "unsupported_media_type")
        let missing = harness.call(.submitJob, body: fetchJob(upstream.url("/json")), json: false)
        XCTAssertEqual(missing.status, 415)
        XCTAssertEqual(harness.call(.submitJob, json: false).status, 415, "no Content-Type and no body")
        let latin1 = harness.call(
            .submitJob, headers: [("Content-Type", "application/json; charset=iso-8859-1")],
            body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(latin1.status, 415)
    }

    func testEmptyOrNonJSONBodyIs400MalformedJSON() {
        let empty = harness.call(.submitJob, headers: [("Content-Type", "application/json")])
        XCTAssertEqual(empty.status, 400)
        XCTAssertEqual(empty.errorCode, "malformed_json")
        let broken = harness.call(.submitJob, body: #"{"graph": "#)
        XCTAssertEqual(broken.status, 400)
        XCTAssertEqual(broken.errorCode, "malformed_json")
        XCTAssertNotNil(broken.json?["error"]?["message"]?.stringValue)
    }

    func testJSONNestedTooDeepIs422WithTheParsersPointer() throws {
        let depth = 600
        let body = #"{"graph":"# + String(repeating: "[", count: depth) + String(repeating: "]", count: depth) + "}"
        let answer = harness.call(.submitJob, body: body)
        XCTAssertEqual(answer.status, 422, answer.text)
        XCTAssertEqual(answer.errorCode, "invalid_graph")
        let path = try XCTUnwrap(answer.json?["error"]?["path"]?.stringValue)
        XCTAssertTrue(path.hasPrefix("/graph/0/0/0"), path)
    }

    func testInvalidGraphIs422WithPathAndDetails() throws {
        let answer = harness.call(.submitJob, body: #"{"graph":{"type":"fetch","url":"ftp://example.com/x"}}"#)
        XCTAssertEqual(answer.status, 422, answer.text)
        let error = try XCTUnwrap(answer.json?["error"])
        XCTAssertEqual(error["code"], "invalid_graph")
        XCTAssertEqual(error["path"], "/graph/url")
        XCTAssertTrue(error["message"]?.stringValue?.hasPrefix("graph.url: ") == true, error.text)
        let details = try XCTUnwrap(error["details"]?.arrayValue)
        XCTAssertFalse(details.isEmpty)
        XCTAssertEqual(details.first?["path"], "/graph/url")
        XCTAssertEqual(details.first?.objectValue?.map(\.key), ["path", "message"])
    }

    func testNonObjectBodyIs422() {
        let answer = harness.call(.submitJob, body: "[1,2]")
        XCTAssertEqual(answer.status, 422, answer.text)
        XCTAssertEqual(answer.errorCode, "invalid_graph")
    }

    func testIdempotencyKeyReturnsTheFirstJobAnd409ForAnotherBody() {
        let body = fetchJob(upstream.url("/json"))
        let first = harness.call(.submitJob, headers: [("Idempotency-Key", "k-1")], body: body)
        XCTAssertEqual(first.status, 201, first.text)
        let again = harness.call(.submitJob, headers: [("Idempotency-Key", "k-1")], body: body)
        XCTAssertEqual(again.status, 200, again.text)
        XCTAssertEqual(again.json?["id"], first.json?["id"])
        XCTAssertEqual(again.headers["Location"], first.headers["Location"])
        let other = harness.call(.submitJob, headers: [("Idempotency-Key", "k-1")], body: fetchJob(upstream.url("/json?x")))
        XCTAssertEqual(other.status, 409, other.text)
        XCTAssertEqual(other.errorCode, "conflict")
    }

    func testIdempotencyKeyOver200CharactersIs400() {
        let ok = harness.call(
            .submitJob, headers: [("Idempotency-Key", String(repeating: "k", count: 200))], body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(ok.status, 201, ok.text)
        let long = harness.call(
            .submitJob, headers: [("Idempotency-Key", String(repeating: "k", count: 201))], body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(long.status, 400)
        XCTAssertEqual(long.errorCode, "bad_request")
    }

    func testFullQueueIs429WithRetryAfter() throws {
        try restart { $0.maxActiveJobs = 1 }
        _ = harness.submit(fetchJob(upstream.url("/hang")))
        let asked = DispatchTime.now()
        let answer = harness.call(.submitJob, body: fetchJob(upstream.url("/hang")))
        // Held before it is sent, so a client that submits again at once cannot flood the server with refusals.
        // (A lower bound only: a slow machine can only make it longer.)
        let heldMs = Double(DispatchTime.now().uptimeNanoseconds - asked.uptimeNanoseconds) / 1e6
        XCTAssertGreaterThanOrEqual(heldMs, Double(App.fullRefusalDelayMs))
        XCTAssertEqual(answer.status, 429, answer.text)
        XCTAssertEqual(answer.errorCode, "too_many_jobs")
        XCTAssertEqual(answer.headers["Retry-After"], "1")
        // Refused before its body is read: even one that is not a job.
        XCTAssertEqual(harness.call(.submitJob, body: "{\"graph\": [").status, 429)
        // A job that waits for its time is not an active one, whether its key is spelt plainly or in escapes.
        let later = ISO8601DateFormatter().string(from: Date().addingTimeInterval(3600))
        for key in ["not_before", "not\\u005fbefore"] {
            let scheduled = harness.call(
                .submitJob, body: "{\"graph\":{\"type\":\"fetch\",\"url\":\"\(upstream.url("/json"))\"},\"\(key)\":\"\(later)\"}")
            XCTAssertEqual(scheduled.status, 201, "\(key): \(scheduled.text)")
        }
        XCTAssertFalse(App.mayWaitForItsTime(Array("{\"graph\":{\"type\":\"fetch\",\"url\":\"http://h/\"}}".utf8)))
        XCTAssertTrue(App.mayWaitForItsTime(Array("{\"not_before\":1}".utf8)))
        XCTAssertTrue(App.mayWaitForItsTime(Array("{\"a\":\"\\n\"}".utf8)))
    }

    // MARK: Reading

    func testUnknownJobOrNodeIs404OnEveryRoute() {
        for route in [Route.getJob, .deleteJob, .cancelJob, .listNodes] {
            let answer = harness.call(route, id: "01NOSUCHJOB")
            XCTAssertEqual(answer.status, 404, "\(route)")
            XCTAssertEqual(answer.errorCode, "not_found", "\(route)")
        }
        for route in [Route.getNode, .getNodeBody] {
            XCTAssertEqual(harness.call(route, id: "01NOSUCHJOB", node: "root").status, 404, "\(route)")
        }
        let id = harness.submit(fetchJob(upstream.url("/json")))
        let node = harness.call(.getNode, id: id, node: "nope")
        XCTAssertEqual(node.status, 404)
        XCTAssertTrue(node.json?["error"]?["message"]?.stringValue?.contains("nope") == true)
        XCTAssertEqual(harness.call(.getNodeBody, id: id, node: "nope").status, 404)
    }

    func testBadQueryParametersAre400() {
        let id = harness.submit(fetchJob(upstream.url("/json")))
        let cases: [(Route, [(String, String)])] = [
            (.getJob, [("wait", "61")]), (.getJob, [("wait", "x")]), (.getJob, [("wait", "1"), ("since", "v3")]),
            (.listJobs, [("limit", "0")]), (.listJobs, [("limit", "501")]), (.listJobs, [("state", "done")]),
            (.listJobs, [("cursor", "not-a-cursor")]), (.listNodes, [("include", "everything")]),
        ]
        for (route, query) in cases {
            let answer = harness.call(route, id: id, query: query)
            XCTAssertEqual(answer.status, 400, "\(route) \(query): \(answer.text)")
            XCTAssertEqual(answer.errorCode, "bad_request", "\(route) \(query)")
        }
    }

    func testListIsNewestFirstWithoutResultAndPagesByCursor() throws {
        let ids = (0..<3).map { harness.submit(fetchJob(upstream.url("/json"), name: "job\($0)")) }
        let first = harness.call(.listJobs, query: [("limit", "2")])
        XCTAssertEqual(first.status, 200, first.text)
        let page = try XCTUnwrap(first.json)
        XCTAssertEqual(page.objectValue?.map(\.key), ["jobs", "next_cursor"])
        let jobs = try XCTUnwrap(page["jobs"]?.arrayValue)
        XCTAssertEqual(jobs.compactMap { $0["id"]?.stringValue }, [ids[2], ids[1]])
        XCTAssertNil(jobs.first?["result"])
        let cursor = try XCTUnwrap(page["next_cursor"]?.stringValue)
        let second = try XCTUnwrap(harness.call(.listJobs, query: [("limit", "2"), ("cursor", cursor)]).json)
        XCTAssertEqual(second["jobs"]?.arrayValue?.compactMap { $0["id"]?.stringValue }, [ids[0]])
        XCTAssertEqual(second["next_cursor"], .null)
    }

    func testListFiltersByState() throws {
        let done = harness.submit(fetchJob(upstream.url("/json")))
        _ = harness.settled(done)
        let hanging = harness.submit(fetchJob(upstream.url("/hang")))
        let succeeded = try XCTUnwrap(harness.call(.listJobs, query: [("state", "succeeded")]).json)
        XCTAssertEqual(succeeded["jobs"]?.arrayValue?.compactMap { $0["id"]?.stringValue }, [done])
        let cancelled = try XCTUnwrap(harness.call(.listJobs, query: [("state", "cancelled")]).json)
        XCTAssertEqual(cancelled["jobs"]?.arrayValue?.count, 0)
        _ = harness.call(.cancelJob, id: hanging)
    }

    func testNodesRoutesShowTreeResultsAndBody() throws {
        let body = #"{"graph":{"type":"list","children":[{"id":"a","type":"fetch","url":"\#(upstream.url("/json"))"}]}}"#
        let id = harness.submit(body)
        XCTAssertEqual(harness.settled(id)?["state"], "succeeded")

        let plain = try XCTUnwrap(harness.call(.listNodes, id: id).json?["nodes"]?.arrayValue)
        XCTAssertEqual(plain.compactMap { $0["id"]?.stringValue }, ["root", "a"])
        XCTAssertEqual(
            plain.first?.objectValue?.map(\.key),
            ["id", "parent", "type", "state", "attempts", "started_at", "finished_at", "elapsed_ms", "status", "error",
             "recovered"])
        XCTAssertEqual(plain.last?["parent"], "root")
        XCTAssertEqual(plain.last?["status"], 200)

        let full = try XCTUnwrap(harness.call(.listNodes, id: id, query: [("include", "result")]).json?["nodes"]?.arrayValue)
        XCTAssertEqual(full.last?.objectValue?.last?.key, "result")
        XCTAssertNotEqual(full.last?["result"], .null)

        let node = harness.call(.getNode, id: id, node: "a")
        XCTAssertEqual(node.status, 200)
        XCTAssertEqual(node.json?["id"], "a")
        XCTAssertNotNil(node.json?["result"])

        let raw = harness.call(.getNodeBody, id: id, node: "a")
        XCTAssertEqual(raw.status, 200)
        XCTAssertEqual(raw.headers["Content-Type"], "application/json")
        XCTAssertEqual(raw.text, #"{"ok":true}"#)
        let listBody = harness.call(.getNodeBody, id: id, node: "root")
        XCTAssertEqual(listBody.status, 404)
        XCTAssertEqual(listBody.errorCode, "not_found")
    }

    // MARK: Long-polling

    func testWaitAnswersOnceTheJobSettles() {
        let id = harness.submit(fetchJob(upstream.url("/json")))
        let answer = harness.call(.getJob, id: id, query: [("wait", "10")])
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.json?["state"], "succeeded")
        XCTAssertNotEqual(answer.json?["result"], .null)
    }

    func testWaitTimesOutWithTheJobAsItIs() {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        let started = Date()
        let answer = harness.call(.getJob, id: id, query: [("wait", "1")])
        let elapsed = Date().timeIntervalSince(started)
        XCTAssertEqual(answer.status, 200)
        XCTAssertFalse(NodeState(rawValue: answer.json?["state"]?.stringValue ?? "")?.isSettled ?? true)
        XCTAssertGreaterThan(elapsed, 0.9)
        _ = harness.call(.cancelJob, id: id)
    }

    func testWaitZeroAnswersAtOnce() {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        // The job never changes: an answer at all is one that did not wait for a change.
        XCTAssertEqual(harness.call(.getJob, id: id, query: [("wait", "0")]).status, 200)
        _ = harness.call(.cancelJob, id: id)
    }

    func testWaitSinceAnswersWhenTheVersionGrows() throws {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        let version = try XCTUnwrap(harness.call(.getJob, id: id).json?["version"]?.intValue)
        let box = AnswerBox()
        harness.start(.getJob, id: id, query: [("wait", "20"), ("since", String(version))]) { box.put($0) }
        _ = harness.call(.cancelJob, id: id)
        let answer = try XCTUnwrap(box.wait(5))
        XCTAssertEqual(answer.status, 200)
        XCTAssertGreaterThan(answer.json?["version"]?.intValue ?? 0, version)
    }

    // MARK: Retry (API.md §8)

    func testRetryAnswers202WithTheNextAttemptAnd409WhenNotFailedOrCancelled() throws {
        let id = harness.submit(fetchJob(upstream.url("/status/503")))
        XCTAssertEqual(harness.settled(id)?["state"], "failed")
        let retried = harness.call(.retryJob, id: id)
        XCTAssertEqual(retried.status, 202, retried.text)
        XCTAssertEqual(retried.json?["attempt"]?.intValue, 2)
        XCTAssertEqual(harness.settled(id)?["attempt"]?.intValue, 2)
        let running = harness.submit(fetchJob(upstream.url("/hang")))
        let conflict = harness.call(.retryJob, id: running)
        XCTAssertEqual(conflict.status, 409, conflict.text)
        XCTAssertEqual(conflict.errorCode, "conflict")
        _ = harness.call(.cancelJob, id: running)
        XCTAssertEqual(harness.call(.retryJob, id: "01NOSUCHJOB").status, 404)
    }

    func testWaitForUnknownJobIs404() {
        XCTAssertEqual(harness.call(.getJob, id: "01NOSUCHJOB", query: [("wait", "5")]).status, 404)
    }

    func testClientGoingAwayCancelsTheWait() throws {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        let box = AnswerBox()
        let closer = CloseActionBox()
        harness.start(.getJob, id: id, query: [("wait", "1")], onClose: { closer.set($0) }) { box.put($0) }
        closer.run()
        XCTAssertNil(box.wait(2), "a cancelled wait must not answer")
        _ = harness.call(.cancelJob, id: id)
    }

    func testEngineShutdownAnswersOpenWaitsAtOnce() throws {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        let box = AnswerBox()
        harness.start(.getJob, id: id, query: [("wait", "30")]) { box.put($0) }
        waitForLongPolls(1)
        harness.engine.beginShutdown()
        let answer = try XCTUnwrap(box.wait(3))
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.json?["id"]?.stringValue, id)
    }

    /// Waits (at most 5 s) until `count` long-polls are waiting in the engine, and `/metrics` says so.
    func waitForLongPolls(_ count: Int) {
        XCTAssertTrue(harness.engine.waitForLongPolls(milliseconds: 5000) { $0 == count }, "\(count) long-polls never waited")
        let metrics = harness.call(.metrics, json: false).text
        XCTAssertTrue(metrics.contains("\njobserver_long_polls_waiting \(count)\n"), metrics)
    }

    // MARK: Cancel and delete

    func testCancelRunningIs202ThenAlreadyCancelledIs200() {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        let first = harness.call(.cancelJob, id: id)
        XCTAssertEqual(first.status, 202, first.text)
        XCTAssertEqual(first.json?["id"]?.stringValue, id)
        XCTAssertEqual(harness.settled(id)?["state"], "cancelled")
        let second = harness.call(.cancelJob, id: id)
        XCTAssertEqual(second.status, 200, second.text)
        XCTAssertEqual(second.json?["state"], "cancelled")
        XCTAssertEqual(second.json?["error"]?["kind"], "cancelled")
    }

    func testCancelSucceededJobIs409() {
        let id = harness.submit(fetchJob(upstream.url("/json")))
        XCTAssertEqual(harness.settled(id)?["state"], "succeeded")
        let answer = harness.call(.cancelJob, id: id)
        XCTAssertEqual(answer.status, 409)
        XCTAssertEqual(answer.errorCode, "conflict")
    }

    func testDeleteIs409WhileRunningAnd204OnceSettled() {
        let id = harness.submit(fetchJob(upstream.url("/hang")))
        let refused = harness.call(.deleteJob, id: id)
        XCTAssertEqual(refused.status, 409)
        XCTAssertEqual(refused.errorCode, "conflict")
        _ = harness.call(.cancelJob, id: id)
        _ = harness.settled(id)
        let deleted = harness.call(.deleteJob, id: id)
        XCTAssertEqual(deleted.status, 204)
        XCTAssertTrue(deleted.body.isEmpty)
        XCTAssertEqual(harness.call(.getJob, id: id).status, 404)
    }

    // MARK: Auth, health, shutdown, metrics, request ids

    func testTokenGuardsEveryRouteButHealthz() throws {
        try restart { $0.token = "s3cret" }
        let missing = harness.call(.listJobs, headers: [("Authorization", "")])
        XCTAssertEqual(missing.status, 401)
        XCTAssertEqual(missing.errorCode, "unauthorized")
        XCTAssertEqual(missing.headers["WWW-Authenticate"], "Bearer")
        XCTAssertEqual(harness.call(.metrics, headers: [("Authorization", "Bearer wrong")]).status, 401)
        XCTAssertEqual(harness.call(.submitJob, headers: [("Authorization", "Bearer s3cre")], body: "{}").status, 401)
        XCTAssertEqual(harness.call(.listJobs).status, 200)
        XCTAssertEqual(harness.call(.health, headers: [("Authorization", "")]).status, 200)
    }

    func testHealthzAndSubmitsAnswer503OnceShutdownBegins() {
        let ok = harness.call(.health)
        XCTAssertEqual(ok.status, 200)
        XCTAssertEqual(ok.text, #"{"status":"ok"}"#)
        harness.app.beginShutdown()
        let health = harness.call(.health)
        XCTAssertEqual(health.status, 503)
        XCTAssertEqual(health.errorCode, "shutting_down")
        let submit = harness.call(.submitJob, body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(submit.status, 503)
        XCTAssertEqual(submit.errorCode, "shutting_down")
    }

    func testEngineRefusingSubmissionsIs503() {
        harness.engine.beginShutdown()
        let submit = harness.call(.submitJob, body: fetchJob(upstream.url("/json")))
        XCTAssertEqual(submit.status, 503)
        XCTAssertEqual(submit.errorCode, "shutting_down")
    }

    func testMetricsAndOpenAPIRoutes() {
        let metrics = harness.call(.metrics)
        XCTAssertEqual(metrics.status, 200)
        XCTAssertEqual(metrics.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
        XCTAssertTrue(metrics.text.contains("# TYPE jobserver_jobs gauge\n"))
        XCTAssertTrue(metrics.text.contains("jobserver_fetch_duration_seconds_bucket{le=\"+Inf\"}"))
        let spec = harness.call(.openAPI)
        XCTAssertEqual(spec.status, 200)
        XCTAssertEqual(spec.headers["Content-Type"], "application/yaml")
        XCTAssertEqual(spec.text, openAPISpec)
    }

    func testResponsesWithoutAHandlerAreCountedAndLogged() throws {
        let configuration = harness.app.makeServerConfiguration()
        XCTAssertEqual(configuration.host, "127.0.0.1")
        XCTAssertEqual(configuration.maxRequestBodyBytes, harness.config.maxRequestBytes)
        let hook = try XCTUnwrap(configuration.onResponse)
        hook(nil, "GET", 404, 2_000_000)
        hook("/v1/jobs", "PUT", 405, 1_000_000)
        hook("/v1/jobs/{id}", "GET", 200, 1_000_000)
        let counts = harness.app.httpRequests.snapshot
        XCTAssertEqual(counts[.init(route: "unmatched", method: "GET", status: 404)], 1)
        XCTAssertEqual(counts[.init(route: "/v1/jobs", method: "PUT", status: 405)], 1)
        XCTAssertEqual(counts[.init(route: "/v1/jobs/{id}", method: "GET", status: 200)], 1)
        let lines = harness.logs.all.filter { $0["msg"] == "request" && $0["request_id"] == nil }
        XCTAssertEqual(lines.map { $0["status"]?.intValue ?? 0 }, [404, 405], "a handler's answers are logged by its exchange")
        XCTAssertEqual(lines.first?["duration_ms"], 2)
    }

    func testRequestIdIsEchoedOrGeneratedAndEveryRequestLogged() throws {
        let given = harness.call(.health, headers: [("X-Request-Id", "req-42.a:b")])
        XCTAssertEqual(given.headers["X-Request-Id"], "req-42.a:b")
        let unsafe = harness.call(.health, headers: [("X-Request-Id", "has space")])
        XCTAssertEqual(harness.call(.health, headers: [("X-Request-Id", "{x}")]).headers["X-Request-Id"], "{x}")
        let generated = try XCTUnwrap(unsafe.headers["X-Request-Id"])
        XCTAssertEqual(generated.count, 32)
        XCTAssertNotEqual(generated, "has space")
        let tooLong = harness.call(.health, headers: [("X-Request-Id", String(repeating: "a", count: 201))])
        XCTAssertEqual(tooLong.headers["X-Request-Id"]?.count, 32)

        let line = try XCTUnwrap(harness.logs.all.first { $0["request_id"] == "req-42.a:b" })
        XCTAssertEqual(line["msg"], "request")
        XCTAssertEqual(line["method"], "GET")
        XCTAssertEqual(line["path"], "/healthz")
        XCTAssertEqual(line["status"], 200)
        XCTAssertNotNil(line["duration_ms"]?.intValue)
    }
}

/// Holds the close action a route registered, to play the client going away.
final class CloseActionBox: @unchecked Sendable {
    // @unchecked: `action` is read and written only with `lock` held.
    private let lock = NSLock()
    private var action: (@Sendable () -> Void)?

    func set(_ action: @escaping @Sendable () -> Void) {
        lock.lock()
        self.action = action
        lock.unlock()
    }

    func run() {
        lock.lock()
        let action = action
        lock.unlock()
        action?()
    }
}
