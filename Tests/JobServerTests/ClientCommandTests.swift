import JobCore
import XCTest

@testable import JobServer

final class ClientCommandTests: XCTestCase {
    func testFlagsEnvironmentAndDefaults() throws {
        let plain = try ClientCommand.parse(["jobs"], environment: [:])
        XCTAssertEqual(plain.server, "http://127.0.0.1:8080")
        XCTAssertNil(plain.token)

        let env = try ClientCommand.parse(
            ["submit", "-", "--follow"], environment: ["JOBSERVER_URL": "http://h:1/", "JOBSERVER_TOKEN": "t"])
        XCTAssertEqual(env.server, "http://h:1")
        XCTAssertEqual(env.token, "t")
        XCTAssertEqual(env.arguments, ["-"])
        XCTAssertTrue(env.follow)

        let flags = try ClientCommand.parse(
            ["jobs", "--server=http://x:2", "--token", "u", "--state", "failed", "--limit", "5"],
            environment: ["JOBSERVER_URL": "http://h:1"])
        XCTAssertEqual(flags.server, "http://x:2")
        XCTAssertEqual(flags.token, "u")
        XCTAssertEqual(flags.state, "failed")
        XCTAssertEqual(flags.limit, 5)
    }

    func testUsageErrorsExit2() {
        for arguments in [
            ["submit"], ["get"], ["get", "a", "b"], ["jobs", "x"], ["jobs", "--bogus"], ["get", "a", "--wait"],
            ["jobs", "--limit", "0"], ["jobs", "--server"], ["get", "a", "--state", "failed"],
            ["jobs", "--server", "ftp://x"],
        ] {
            XCTAssertThrowsError(try ClientCommand.parse(arguments, environment: [:]), "\(arguments)") { error in
                XCTAssertEqual((error as? ClientFailure)?.exitStatus, 2, "\(arguments)")
            }
        }
    }

    func testProgressLineOnATerminalAndPiped() throws {
        let job = try JSONValue.parse(
            #"{"state":"running","progress":{"total":4,"done":1,"running":2,"pending":1,"succeeded":1,"failed":0,"cancelled":0,"skipped":0}}"#)
        XCTAssertEqual(
            ProgressLine.render(job, terminal: false),
            "running 1/4 running 2 pending 1 succeeded 1 failed 0 cancelled 0 skipped 0")
        XCTAssertTrue(ProgressLine.render(job, terminal: true).hasPrefix("[######------------------] 25% 1/4 running"))
    }
}
