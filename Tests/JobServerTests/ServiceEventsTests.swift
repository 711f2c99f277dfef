import Foundation
import JobCore
import TestSupport
import XCTest

@testable import JobServer

/// `GET /v1/jobs/{id}/events` through the whole service with curl: keep-alive comments, and the last event when the
/// server shuts down.
final class ServiceEventsTests: XCTestCase {
    private var upstream: Upstream!
    private var service: Service?
    private var port = 0
    private var dir: URL!

    override func setUpWithError() throws {
        upstream = try Upstream.start()
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("jobserver-events-\(UUID().uuidString)")
        var config = ServerConfig()
        config.host = "127.0.0.1"
        config.port = 0
        config.dbPath = dir.appendingPathComponent("jobs.sqlite").path
        config.denyCIDRs = []
        config.shutdownGraceMs = 3000
        config.eventsKeepAliveMs = 100
        let service = try Service(config: config, logger: .disabled)
        port = try service.start()
        self.service = service
    }

    override func tearDown() {
        service?.shutdown()
        upstream?.stop()
        if let dir { try? FileManager.default.removeItem(at: dir) }
        service = nil
        upstream = nil
        dir = nil
    }

    /// Runs curl with `arguments`; its standard output once it exits.
    private static func curl(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["curl"] + arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }

    private func submitHangingJob() throws -> String {
        let body = #"{"graph":{"type":"fetch","url":"\#(upstream.url("/hang"))"}}"#
        let created = try RawHTTPClient.send(
            port: port, "POST", "/v1/jobs", headers: [("Content-Type", "application/json")], body: body)
        XCTAssertEqual(created.status, 201, created.text)
        return try XCTUnwrap(created.json?["id"]?.stringValue)
    }

    func testIdleStreamGetsKeepAliveComments() throws {
        let id = try submitHangingJob()
        // curl gives up after 1 s (exit 28): the stream stays open while the job hangs.
        let text = try Self.curl(["-sN", "--max-time", "1", "http://127.0.0.1:\(port)/v1/jobs/\(id)/events"])
        XCTAssertTrue(text.hasPrefix("event: job\nid: "), text)
        XCTAssertGreaterThanOrEqual(text.components(separatedBy: ": keep-alive\n\n").count - 1, 2, text)
    }

    func testShutdownEndsTheStreamWithTheJobAsItIs() throws {
        let id = try submitHangingJob()
        let output = Box<String>("")
        let done = expectation(description: "curl ended")
        let port = self.port
        Thread {
            output.value = (try? Self.curl(["-sN", "--max-time", "20", "http://127.0.0.1:\(port)/v1/jobs/\(id)/events"])) ?? ""
            done.fulfill()
        }.start()
        // Once the stream is open, stop the server.
        _ = TestSupport.eventually(10) { (service?.app.eventStreams.count ?? 0) > 0 }
        XCTAssertEqual(service?.app.eventStreams.count, 1)
        service?.shutdown()
        service = nil
        wait(for: [done], timeout: 15)
        let events = output.value.components(separatedBy: "\n\n").filter { $0.hasPrefix("event: job") }
        XCTAssertEqual(events.count, 2, output.value)
    }
}

private final class Box<T>: @unchecked Sendable {
    // @unchecked: the thread that sets `value` fulfils an expectation after it, and the test reads `value` only
    // once it has waited for that expectation.
    var value: T
    init(_ value: T) { self.value = value }
}
