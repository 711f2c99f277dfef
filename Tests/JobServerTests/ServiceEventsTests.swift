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
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        curl.arguments = ["curl", "-sN", "--max-time", "20", "http://127.0.0.1:\(port)/v1/jobs/\(id)/events"]
        let pipe = Pipe()
        curl.standardOutput = pipe
        let output = PipeReader(pipe)
        try curl.run()
        // Once the stream is open (its first event arrived), stop the server.
        XCTAssertTrue(output.waitForText(10) { $0.contains("event: job") }, output.text)
        XCTAssertEqual(service?.app.eventStreams.count, 1)
        service?.shutdown()
        service = nil
        XCTAssertTrue(output.waitForEnd(15), "the stream did not end with the server")
        curl.waitUntilExit()
        let events = output.text.components(separatedBy: "\n\n").filter { $0.hasPrefix("event: job") }
        XCTAssertEqual(events.count, 2, output.text)
    }
}
