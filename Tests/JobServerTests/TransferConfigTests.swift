import Foundation
import JobCore
import XCTest

@testable import JobServer

/// The transfer layer's flags (API.md §9): bad values are refused at start with the reason.
final class TransferConfigTests: XCTestCase {
    private func parse(_ args: [String]) throws -> ServerConfig {
        guard case .serve(let config) = try CommandLineParser.parse(args, environment: [:]) else {
            throw ConfigError(message: "expected serve")
        }
        return config
    }

    private func assertRefused(_ args: [String], mentioning text: String, line: UInt = #line) {
        XCTAssertThrowsError(try parse(args), line: line) { error in
            let message = (error as? ConfigError)?.message ?? ""
            XCTAssertTrue(message.contains(text), "\(message) should mention \(text)", line: line)
        }
    }

    func testHostRatesAreRepeatableAndReachTheEngine() throws {
        let config = try parse(["--host-rate", "api.local=20/s", "--host-rate", "*=100/s,[::1]=2.5/s"])
        XCTAssertEqual(config.hostRates.map(\.host), ["api.local", "*", "::1"])
        XCTAssertEqual(config.engineConfiguration.hostRates.map(\.perSecond), [20, 100, 2.5])
        let env = try CommandLineParser.parse([], environment: ["JOBSERVER_HOST_RATE": "a=1/s"])
        guard case .serve(let fromEnv) = env else { return XCTFail("expected serve") }
        XCTAssertEqual(fromEnv.hostRates, [HostRate(host: "a", perSecond: 1)])
    }

    func testBadHostRatesAreRefused() {
        assertRefused(["--host-rate", "api.local"], mentioning: "--host-rate")
        assertRefused(["--host-rate", "api.local=0/s"], mentioning: "rate must be N/s")
        assertRefused(["--host-rate", "a=1/s", "--host-rate", "a=2/s"], mentioning: "given twice")
    }

    func testCAFileMustHoldACertificate() throws {
        let path = NSTemporaryDirectory() + "transfer-config-\(UUID().uuidString).pem"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try Data("not a certificate".utf8).write(to: URL(fileURLWithPath: path))
        assertRefused(["--ca-file", path], mentioning: "no PEM certificate")
        assertRefused(["--ca-file", path + ".missing"], mentioning: "cannot read")
    }
}
