import Foundation
import JobCore
import TestSupport
import XCTest

/// The `jobserver` binary itself: exit codes, stdout silence, SIGTERM.
final class ExecutableTests: XCTestCase {
    private func binary() throws -> URL {
        // SwiftPM puts the executable in the build folder that holds the test bundle.
        let bundle = Bundle(for: Self.self).bundleURL
        let candidates = [bundle, bundle.deletingLastPathComponent()].map { $0.appendingPathComponent("jobserver") }
        guard let url = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0.path) }) else {
            throw XCTSkip("jobserver binary not built next to the tests at \(bundle.path)")
        }
        return url
    }

    /// Starts the `jobserver` binary with `arguments`; its stdout and stderr are collected as they come.
    private func run(_ arguments: [String], environment: [String: String] = [:]) throws
        -> (Process, PipeReader, PipeReader)
    {
        let process = Process()
        process.executableURL = try binary()
        process.arguments = arguments
        // A sanitizer build's child reports where the test's own reports go (`make test-sanitize`).
        let sanitizerOptions = ProcessInfo.processInfo.environment.filter { $0.key.hasSuffix("SAN_OPTIONS") }
        process.environment = sanitizerOptions.merging(environment) { $1 }
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        let outReader = PipeReader(out)
        let errReader = PipeReader(err)
        try process.run()
        return (process, outReader, errReader)
    }

    /// Waits (at most `seconds`) for the child to exit: both its output pipes end when it does (nothing else holds
    /// them), then `waitUntilExit` collects it.
    private func waitForExit(_ process: Process, _ out: PipeReader, _ err: PipeReader, seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        guard out.waitForEnd(seconds), err.waitForEnd(max(0, deadline.timeIntervalSinceNow)) else { return false }
        // Foundation's Process also stays on this thread's run loop, which holds it (and its pipes) in a cycle,
        // until waitUntilExit takes it off.
        process.waitUntilExit()
        return true
    }

    func testBadFlagExits2WithTheReasonOnStderr() throws {
        let (process, out, err) = try run(["serve", "--port", "99999"])
        XCTAssertTrue(waitForExit(process, out, err, seconds: 10))
        XCTAssertEqual(process.terminationStatus, 2)
        XCTAssertTrue(err.waitForEnd(5))
        XCTAssertTrue(err.text.contains("--port"), err.text)
        XCTAssertTrue(out.waitForEnd(5))
        XCTAssertEqual(out.text, "")
    }

    func testBadEnvironmentValueExits2() throws {
        let (process, out, err) = try run([], environment: ["JOBSERVER_RETENTION": "forever"])
        XCTAssertTrue(waitForExit(process, out, err, seconds: 10))
        XCTAssertEqual(process.terminationStatus, 2)
        XCTAssertTrue(err.waitForEnd(5))
        XCTAssertTrue(err.text.contains("JOBSERVER_RETENTION"), err.text)
    }

    func testHelpPrintsUsageAndExits0() throws {
        let (process, out, err) = try run(["--help"])
        XCTAssertTrue(waitForExit(process, out, err, seconds: 10))
        XCTAssertEqual(process.terminationStatus, 0)
        XCTAssertTrue(out.waitForEnd(5))
        XCTAssertTrue(out.text.contains("--shutdown-grace"), out.text)
    }

    func testSIGTERMStopsTheServerWithExit0AndStdoutStaysSilent() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("jobserver-exe-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let (process, out, err) = try run(
            ["serve", "--host", "127.0.0.1", "--port", "0", "--shutdown-grace", "3s"],
            environment: ["JOBSERVER_DB": dir.appendingPathComponent("db/jobs.sqlite").path])
        let bound = try XCTUnwrap(err.waitForListeningPort(15), "no listening line: \(err.text)")
        XCTAssertEqual(try RawHTTPClient.send(port: bound, "GET", "/healthz").status, 200)

        kill(process.processIdentifier, SIGTERM)
        XCTAssertTrue(waitForExit(process, out, err, seconds: 10), "still running 10 s after SIGTERM")
        XCTAssertEqual(process.terminationReason, .exit)
        XCTAssertEqual(process.terminationStatus, 0)
        XCTAssertTrue(out.waitForEnd(5))
        XCTAssertEqual(out.text, "")
        XCTAssertTrue(err.waitForEnd(5))
        XCTAssertTrue(err.text.contains(#""msg":"stopped""#), err.text)
    }
}
