import Foundation
import JobCore
import TestSupport
import XCTest

@testable import JobServer

/// The whole service on a real socket (port 0), driven by a raw HTTP/1.1 client.
final class ServiceEndToEndTests: XCTestCase {
    private var upstream: Upstream!
    private var service: Service?
    private var port = 0
    private var dir: URL!

    override func setUpWithError() throws {
        upstream = try Upstream.start()
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("jobserver-e2e-\(UUID().uuidString)")
    }

    override func tearDown() {
        service?.shutdown()
        upstream?.stop()
        if let dir { try? FileManager.default.removeItem(at: dir) }
        service = nil
        upstream = nil
        dir = nil
    }

    private func startService(_ configure: (inout ServerConfig) -> Void = { _ in }) throws {
        var config = ServerConfig()
        config.host = "127.0.0.1"
        config.port = 0
        // A folder that does not exist yet: the service creates it.
        config.dbPath = dir.appendingPathComponent("nested/db/jobs.sqlite").path
        config.denyCIDRs = []
        config.shutdownGraceMs = 3000
        configure(&config)
        let service = try Service(config: config, logger: .disabled)
        port = try service.start()
        self.service = service
    }

    private func send(
        _ method: String, _ target: String, headers: [(String, String)] = [], body: String? = nil
    ) throws -> WireResponse {
        try RawHTTPClient.send(port: port, method, target, headers: headers, body: body)
    }

    func testServiceCreatesTheDatabaseFolderAndListens() throws {
        try startService()
        XCTAssertGreaterThan(port, 0)
        XCTAssertTrue(FileManager.default.fileExists(atPath: dir.appendingPathComponent("nested/db").path))
        let health = try send("GET", "/healthz")
        XCTAssertEqual(health.status, 200)
        XCTAssertEqual(health.text, #"{"status":"ok"}"#)
        XCTAssertNotNil(health.header("X-Request-Id"))
    }

    func testSubmitFollowAndReadTheBodyOverTCP() throws {
        try startService()
        let created = try send(
            "POST", "/v1/jobs", headers: [("Content-Type", "application/json")],
            body: #"{"graph":{"id":"f","type":"fetch","url":"\#(upstream.url("/json"))"}}"#)
        XCTAssertEqual(created.status, 201, created.text)
        let location = try XCTUnwrap(created.header("Location"))
        XCTAssertTrue(location.hasPrefix("/v1/jobs/"))
        let settled = try send("GET", location + "?wait=10")
        XCTAssertEqual(settled.status, 200)
        XCTAssertEqual(settled.json?["state"], "succeeded", settled.text)
        let body = try send("GET", location + "/nodes/f/body")
        XCTAssertEqual(body.status, 200)
        XCTAssertEqual(body.text, #"{"ok":true}"#)
        let head = try send("HEAD", location)
        XCTAssertEqual(head.status, 200)
        XCTAssertTrue(head.body.isEmpty)
    }

    func testUnknownRouteIs404AndWrongMethodIs405WithAllow() throws {
        try startService()
        let missing = try send("GET", "/v2/nothing")
        XCTAssertEqual(missing.status, 404)
        XCTAssertEqual(missing.json?["error"]?["code"], "not_found")
        let wrong = try send("PUT", "/v1/jobs")
        XCTAssertEqual(wrong.status, 405)
        let allow = try XCTUnwrap(wrong.header("Allow"))
        XCTAssertTrue(allow.contains("GET") && allow.contains("POST"), allow)
    }

    func testWithATokenEveryRouteButHealthzNeedsIt() throws {
        try startService { $0.token = "s3cret" }
        for (method, target) in [("GET", "/nope"), ("PUT", "/v1/jobs"), ("GET", "/v1/jobs")] {
            let answer = try send(method, target)
            XCTAssertEqual(answer.status, 401, "\(method) \(target)")
            XCTAssertEqual(answer.json?["error"]?["code"], "unauthorized")
            XCTAssertEqual(answer.header("WWW-Authenticate"), "Bearer")
        }
        XCTAssertEqual(try send("GET", "/healthz").status, 200)
        XCTAssertEqual(try send("GET", "/nope", headers: [("Authorization", "Bearer s3cret")]).status, 404)
        XCTAssertEqual(try send("PUT", "/v1/jobs", headers: [("Authorization", "Bearer s3cret")]).status, 405)
    }

    func testOversizedBodyIs413() throws {
        try startService { $0.maxRequestBytes = 100 }
        let answer = try send(
            "POST", "/v1/jobs", headers: [("Content-Type", "application/json")],
            body: #"{"graph":{"type":"fetch","url":"http://127.0.0.1/"# + String(repeating: "x", count: 200) + #""}}"#)
        XCTAssertEqual(answer.status, 413)
        XCTAssertEqual(answer.json?["error"]?["code"], "payload_too_large")
    }

    func testMetricsCountRequestsByRoutePattern() throws {
        try startService()
        _ = try send("GET", "/v1/jobs/01NOSUCH")
        _ = try send("GET", "/nope")
        // An answer is counted on its loop before its first byte is written: by the time it arrived, it is counted.
        let text = try send("GET", "/metrics").text
        XCTAssertTrue(text.contains(#"jobserver_http_requests_total{route="/v1/jobs/{id}",method="GET",status="404"} 1"#), text)
        XCTAssertTrue(text.contains(#"route="unmatched",method="GET",status="404""#), text)
    }

    func testShutdownAnswersAnOpenLongPollAndRefusesNewJobs() throws {
        try startService()
        let created = try send(
            "POST", "/v1/jobs", headers: [("Content-Type", "application/json")],
            body: fetchJob(upstream.url("/hang")))
        XCTAssertEqual(created.status, 201, created.text)
        let location = try XCTUnwrap(created.header("Location"))
        let box = WireBox()
        let port = port
        Thread {
            box.put(try? RawHTTPClient.send(port: port, "GET", location + "?wait=30"))
        }.start()
        try waitForLongPolls(1)
        service?.shutdown()
        service = nil
        let answer = try XCTUnwrap(box.wait(5) ?? nil, "the long-poll got no complete answer")
        XCTAssertEqual(answer.status, 200)
        XCTAssertNotNil(answer.json?["id"])
        XCTAssertThrowsError(try send("GET", "/healthz"), "the listener is closed after shutdown")
    }
}

extension ServiceEndToEndTests {
    /// Waits (at most 10 s) until `count` long-polls are waiting in the engine, and `/metrics` says so.
    func waitForLongPolls(_ count: Int) throws {
        guard let engine = service?.engine, engine.waitForLongPolls(milliseconds: 10_000, until: { $0 == count }) else {
            throw UpstreamError("\(count) long-polls never waited")
        }
        let metrics = try send("GET", "/metrics").text
        XCTAssertTrue(metrics.contains("\njobserver_long_polls_waiting \(count)\n"), metrics)
    }

    /// 1,000 long-polls on one running job: they hold no thread while they wait, and every one is answered once the
    /// job settles (here by a cancel, so that nothing but the test decides when).
    func testThousandLongPollsHoldFewThreadsAndAnswerPromptly() throws {
        try startService()
        let created = try RawHTTPClient.send(
            port: port, "POST", "/v1/jobs", headers: [("Content-Type", "application/json")],
            body: #"{"graph":{"type":"fetch","url":"\#(upstream.url("/hang"))"}}"#)
        XCTAssertEqual(created.status, 201, created.text)
        let location = try XCTUnwrap(created.header("Location"))
        let threadsBefore = try Self.threadCount()

        var fds: [Int32] = []
        defer { for fd in fds { close(fd) } }
        let request = Array("GET \(location)?wait=30 HTTP/1.1\r\nHost: test\r\n\r\n".utf8)
        for _ in 0..<1000 {
            let fd = try RawHTTPClient.connect(port: port)
            fds.append(fd)
            XCTAssertEqual(request.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }, request.count)
        }
        try waitForLongPolls(1000)
        let threadsWaiting = try Self.threadCount()
        // A thread per long-poll would be 1,000 more; Dispatch's pool may add a few dozen workers on a loaded machine.
        XCTAssertLessThanOrEqual(threadsWaiting - threadsBefore, 64, "1,000 long-polls took \(threadsWaiting - threadsBefore) threads")
        let cancelled = try RawHTTPClient.send(port: port, "POST", location + "/cancel")
        XCTAssertEqual(cancelled.status, 202, cancelled.text)

        // Collect every answer with the time it arrived.
        var arrivals: [Int64] = []
        var pending = Set(fds.indices)
        var buffers = Array(repeating: [UInt8](), count: fds.count)
        let deadline = Date().addingTimeInterval(20)
        while !pending.isEmpty, Date() < deadline {
            var pfds = pending.map { pollfd(fd: fds[$0], events: Int16(POLLIN), revents: 0) }
            let ready = poll(&pfds, nfds_t(pfds.count), 200)
            guard ready > 0 else { continue }
            let now = Timestamp.nowMs()
            for (k, index) in pending.enumerated() where pfds[k].revents != 0 {
                var chunk = [UInt8](repeating: 0, count: 8192)
                let n = read(fds[index], &chunk, chunk.count)
                if n > 0 { buffers[index] += chunk[0..<n] }
                let text = String(decoding: buffers[index], as: UTF8.self)
                if n <= 0 || (text.contains("\r\n\r\n") && text.hasSuffix("}")) {
                    arrivals.append(now)
                    pending.remove(index)
                }
            }
        }
        XCTAssertTrue(pending.isEmpty, "\(pending.count) long-polls were never answered")
        let settled = try RawHTTPClient.send(port: port, "GET", location)
        XCTAssertEqual(settled.json?["state"], "cancelled")
        let finished = try XCTUnwrap(settled.json?["finished_at"]?.stringValue)
        let finishedMs = try XCTUnwrap(Self.parseTimestamp(finished))
        let delays = arrivals.map { $0 - finishedMs }.sorted()
        // How soon is printed, not asserted: a loaded machine delays it.
        let first = try XCTUnwrap(delays.first)
        let median = delays[delays.count / 2]
        print("long-polls: first answer \(first) ms, median \(median) ms, last \(delays.last ?? 0) ms after the change; \(threadsWaiting - threadsBefore) threads added while waiting")
    }

    static func threadCount() throws -> Int {
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        for line in status.split(separator: "\n") where line.hasPrefix("Threads:") {
            if let n = Int(line.dropFirst("Threads:".count).trimmingCharacters(in: .whitespaces)) { return n }
        }
        throw UpstreamError("no Threads line in /proc/self/status")
    }

    /// `2026-12-02T08:11:28.123Z` as milliseconds since the epoch.
    static func parseTimestamp(_ text: String) -> Int64? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text).map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }
    }
}

/// Hands a wire response over from the client thread.
final class WireBox: @unchecked Sendable {
    // @unchecked: `value` is read and written only with `lock` held; the other properties are constants.
    private let lock = NSLock()
    private let semaphore = DispatchSemaphore(value: 0)
    private var value: WireResponse??

    func put(_ response: WireResponse?) {
        lock.lock()
        value = .some(response)
        lock.unlock()
        semaphore.signal()
    }

    func wait(_ seconds: Double) -> WireResponse?? {
        guard semaphore.wait(timeout: .now() + seconds) == .success else { return nil }
        lock.lock()
        defer { lock.unlock() }
        return value
    }
}
