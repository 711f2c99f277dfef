import Foundation
import JobCore
import TestSupport
import XCTest

/// A real `jobserver` process, killed with SIGKILL while jobs run, restarted on the same SQLite file.
final class CrashRecoveryTests: XCTestCase {
    var upstream: Upstream!
    var directory = ""
    var server: Process?

    override func setUpWithError() throws {
        guard FileManager.default.isExecutableFile(atPath: JobServerProcess.binaryPath) else {
            throw XCTSkip("build the jobserver executable first (swift build)")
        }
        upstream = try Upstream.start()
        directory = NSTemporaryDirectory() + "crash-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDown() {
        if let server, server.isRunning { kill(server.processIdentifier, SIGKILL) }
        upstream?.stop()
        try? FileManager.default.removeItem(atPath: directory)
        server = nil
        upstream = nil
        directory = ""
    }

    func testKilledServerResumesEveryAcceptedJobKeepingSettledResults() throws {
        let db = directory + "/jobs.sqlite"
        var running = try JobServerProcess.start(db: db)
        server = running.process
        let api = running.baseURL

        // One 200-fetch job, spread over time by the per-host limit, and small three-step sequences.
        let bigChildren = (0..<200).map { i in #"{"type":"fetch","url":"\#(upstream.url("/count/big-\(i)?delay_ms=50"))"}"# }
        let big = try Curl.json("POST", api + "/v1/jobs", body: #"{"name":"big","graph":{"type":"list","concurrency":8,"children":[\#(bigChildren.joined(separator: ","))]}}"#)
        XCTAssertEqual(big.status, 201)
        var accepted: [String] = [try XCTUnwrap(big.body["id"]?.stringValue)]
        for j in 0..<20 {
            let steps = (0..<3).map { s in #"{"type":"fetch","url":"\#(upstream.url("/count/small-\(j)-\(s)?delay_ms=300"))"}"# }
            let small = try Curl.json("POST", api + "/v1/jobs", body: #"{"graph":{"type":"sequence","children":[\#(steps.joined(separator: ","))]}}"#)
            XCTAssertEqual(small.status, 201)
            accepted.append(try XCTUnwrap(small.body["id"]?.stringValue))
        }
        // A non-idempotent fetch that will be in flight at the kill.
        let post = try Curl.json("POST", api + "/v1/jobs", body: #"{"graph":{"type":"fetch","method":"POST","url":"\#(upstream.url("/delay/5000"))"}}"#)
        XCTAssertEqual(post.status, 201)
        let postID = try XCTUnwrap(post.body["id"]?.stringValue)

        // Kill in the middle of the big job: once part of it has settled, and before all of it has. Each look after
        // the first is the job's long-poll for a version past the last one seen, so it follows a change.
        var since: Int?
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            let job = try Curl.json("GET", api + "/v1/jobs/\(accepted[0])" + (since.map { "?since=\($0)&wait=5" } ?? "")).body
            if (job["progress"]?["succeeded"]?.intValue ?? 0) >= 20 { break }
            since = job["version"]?.intValue
        }
        // What had settled before the kill must not run again.
        var settledBefore: [String: Set<String>] = [:]
        for id in accepted {
            let nodes = try Curl.json("GET", api + "/v1/jobs/\(id)/nodes")
            for node in nodes.body["nodes"]?.arrayValue ?? [] where node["state"] == "succeeded" && node["type"] == "fetch" {
                settledBefore[id, default: []].insert(try XCTUnwrap(node["id"]?.stringValue))
            }
        }
        // State changes are committed in order, in batches: a 201 answered after the reads above is on disk, and so
        // is every change that was made before it.
        let barrier = try Curl.json("POST", api + "/v1/jobs", body: #"{"graph":{"type":"fetch","url":"\#(upstream.url("/json"))"}}"#)
        XCTAssertEqual(barrier.status, 201)
        kill(running.process.processIdentifier, SIGKILL)
        running.process.waitUntilExit()
        XCTAssertEqual(running.process.terminationReason, .uncaughtSignal)

        running = try JobServerProcess.start(db: db)
        server = running.process
        let api2 = running.baseURL
        for id in accepted + [postID] {
            let job = try Curl.json("GET", api2 + "/v1/jobs/\(id)?wait=30")
            XCTAssertEqual(job.status, 200, "job \(id) lost")
            let state = job.body["state"]?.stringValue
            if id == postID {
                XCTAssertEqual(state, "failed")
                XCTAssertEqual(job.body["error"]?["kind"], "interrupted")
            } else {
                XCTAssertEqual(state, "succeeded", "job \(id): \(job.body)")
            }
        }
        let bigJob = try Curl.json("GET", api2 + "/v1/jobs/\(accepted[0])")
        XCTAssertEqual(bigJob.body["result"]?.arrayValue?.count, 200)
        XCTAssertEqual(bigJob.body["progress"]?["succeeded"], 201)

        // Every fetch ran; the ones settled before the kill ran exactly once.
        let counters = try XCTUnwrap(upstream.stats()["counters"])
        for i in 0..<200 { XCTAssertGreaterThanOrEqual(counters["big-\(i)"]?.intValue ?? 0, 1, "big-\(i) never ran") }
        for j in 0..<20 {
            for s in 0..<3 { XCTAssertGreaterThanOrEqual(counters["small-\(j)-\(s)"]?.intValue ?? 0, 1) }
        }
        var checked = 0
        for (index, id) in accepted.enumerated() {
            for node in settledBefore[id] ?? [] {
                let key: String
                if index == 0 {
                    key = "big-" + (node.split(separator: ".").last.map(String.init) ?? "")
                } else {
                    key = "small-\(index - 1)-" + (node.split(separator: ".").last.map(String.init) ?? "")
                }
                XCTAssertEqual(counters[key]?.intValue, 1, "\(key) settled before the kill but ran again")
                checked += 1
            }
        }
        XCTAssertGreaterThan(checked, 0, "nothing had settled before the kill; the test proves nothing")
        running.stop()
    }

    func testCancelsAnsweredBeforeAKillStayCancelled() throws {
        let db = directory + "/cancel.sqlite"
        var running = try JobServerProcess.start(db: db)
        server = running.process
        let api = running.baseURL
        var ids: [String] = []
        for _ in 0..<40 {
            let job = try Curl.json("POST", api + "/v1/jobs", body: #"{"graph":{"type":"fetch","url":"\#(upstream.url("/hang"))"}}"#)
            XCTAssertEqual(job.status, 201)
            ids.append(try XCTUnwrap(job.body["id"]?.stringValue))
        }
        for id in ids {
            let cancel = try Curl.json("POST", api + "/v1/jobs/\(id)/cancel")
            XCTAssertEqual(cancel.status, 202, "cancel of \(id): \(cancel.body)")
        }
        // Right after the last answer: nothing but what is on disk survives.
        kill(running.process.processIdentifier, SIGKILL)
        running.process.waitUntilExit()

        running = try JobServerProcess.start(db: db)
        server = running.process
        for id in ids {
            let job = try Curl.json("GET", running.baseURL + "/v1/jobs/\(id)")
            XCTAssertEqual(job.body["state"], "cancelled", "job \(id) came back \(job.body["state"] ?? .null)")
        }
        running.stop()
    }

    func testNodeLeftRunningInASettledJobSettlesAfterAKill() throws {
        let db = directory + "/leftover.sqlite"
        var running = try JobServerProcess.start(db: db)
        server = running.process
        let api = running.baseURL
        let body = #"{"graph":{"type":"list","fire_on_first_result":true,"cancel_remaining":false,"children":["#
            + #"{"id":"fast","type":"fetch","url":"\#(upstream.url("/json"))"},"#
            + #"{"id":"slow","type":"fetch","url":"\#(upstream.url("/hang"))"}]}}"#
        let created = try Curl.json("POST", api + "/v1/jobs", body: body)
        XCTAssertEqual(created.status, 201)
        let id = try XCTUnwrap(created.body["id"]?.stringValue)
        let job = try Curl.json("GET", api + "/v1/jobs/\(id)?wait=10")
        XCTAssertEqual(job.body["state"], "succeeded")
        // A listing waits for the store to commit what is queued: the settled job is on disk after it.
        let listed = try Curl.json("GET", api + "/v1/jobs?state=succeeded")
        XCTAssertTrue(listed.body["jobs"]?.arrayValue?.contains { $0["id"]?.stringValue == id } == true)
        let slowBefore = try Curl.json("GET", api + "/v1/jobs/\(id)/nodes/slow")
        XCTAssertEqual(slowBefore.body["state"], "running")
        XCTAssertNotEqual(slowBefore.body["elapsed_ms"], .null, "a running node shows the time so far")
        kill(running.process.processIdentifier, SIGKILL)
        running.process.waitUntilExit()

        running = try JobServerProcess.start(db: db)
        server = running.process
        let after = try Curl.json("GET", running.baseURL + "/v1/jobs/\(id)")
        XCTAssertEqual(after.body["state"], "succeeded")
        XCTAssertEqual(after.body["progress"]?["running"], 0)
        XCTAssertEqual(after.body["progress"]?["pending"], 0)
        let slow = try Curl.json("GET", running.baseURL + "/v1/jobs/\(id)/nodes/slow")
        XCTAssertEqual(slow.body["state"], "cancelled")
        XCTAssertEqual(slow.body["error"]?["kind"], "cancelled")
        XCTAssertEqual(slow.body["error"]?["message"], "the job had settled when the server stopped")
        running.stop()
    }
}

/// A `jobserver` child process on a free loopback port.
struct JobServerProcess {
    let process: Process
    let port: Int
    var baseURL: String { "http://127.0.0.1:\(port)" }

    /// The `jobserver` built with the tests: `JOBSERVER_BIN` if set, else the one in the build folder of the
    /// running test binary (any configuration or triple), else `.build/debug/jobserver` of the package.
    static let binaryPath: String = {
        if let explicit = ProcessInfo.processInfo.environment["JOBSERVER_BIN"], !explicit.isEmpty { return explicit }
        var folders: [URL] = []
        // Linux runs the tests as an executable inside the build folder; macOS loads a bundle placed there.
        if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            folders.append(URL(fileURLWithPath: exe).deletingLastPathComponent())
        }
        folders.append(Bundle.main.bundleURL.deletingLastPathComponent())
        for bundle in Bundle.allBundles where bundle.bundlePath.hasSuffix(".xctest") {
            folders.append(bundle.bundleURL.deletingLastPathComponent())
        }
        for folder in folders {
            let candidate = folder.appendingPathComponent("jobserver").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/jobserver").path
    }()

    /// Starts the server on a port of its choosing and waits (at most 15 s) for the log line that says it listens.
    static func start(db: String, extraArguments: [String] = []) throws -> JobServerProcess {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binaryPath)
        process.arguments = ["serve", "--host", "127.0.0.1", "--port", "0", "--db", db] + extraArguments
        process.standardOutput = FileHandle.nullDevice
        let log = Pipe()
        process.standardError = log
        let reader = PipeReader(log)
        try process.run()
        if let port = reader.waitForListeningPort(15) { return JobServerProcess(process: process, port: port) }
        process.terminate()
        throw UpstreamError("jobserver did not say it listens: \(reader.text.suffix(2000))")
    }

    /// SIGTERM, then wait for the exit.
    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}

/// The real curl as the client.
enum Curl {
    struct Answer {
        var status: Int
        var body: JSONValue
    }

    /// Runs curl and parses the answer as JSON (`null` when it is not JSON).
    static func json(_ method: String, _ url: String, body: String? = nil, headers: [String] = []) throws -> Answer {
        var args = ["-s", "-X", method, "-o", "-", "-w", "\n%{http_code}", "--max-time", "40"]
        for h in headers { args += ["-H", h] }
        if let body { args += ["-H", "Content-Type: application/json", "--data-binary", body] }
        args.append(url)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = args
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard let split = text.lastIndex(of: "\n"), let status = Int(text[text.index(after: split)...]), status > 0 else {
            throw UpstreamError("curl \(method) \(url) failed")
        }
        let payload = Array(text[..<split].utf8)
        return Answer(status: status, body: (try? JSONValue.parse(payload)) ?? .null)
    }
}
