import Foundation
import JobCore
import TestSupport
import XCTest

/// HTTPS through a local CA made at test time: `--ca-file`, host name and issuer checks, the protocol reported.
final class FetcherTLSTests: XCTestCase {
    var tls: TLSMaterial!
    var upstream: Upstream!

    override func setUpWithError() throws {
        tls = try TLSMaterial()
        upstream = try Upstream.start(certificate: tls.server)
    }

    override func tearDown() {
        upstream?.stop()
        tls?.remove()
        upstream = nil
        tls = nil
    }

    private func fetcher(caFile: String?) throws -> Fetcher {
        var configuration = FetcherConfiguration()
        configuration.caFile = caFile
        return try Fetcher(configuration: configuration)
    }

    func testHTTPSWithCAFileSucceedsAndSaysWhichProtocol() throws {
        let fetcher = try fetcher(caFile: tls.caFile)
        defer { fetcher.shutdown() }
        XCTAssertTrue(upstream.url("/json").hasPrefix("https://127.0.0.1:"))
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json"))))
        let response = try XCTUnwrap(outcome.response, "\(String(describing: outcome.error))")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.body, .object(["ok": .bool(true)]))
        // The fixture offers only http/1.1 by ALPN.
        XCTAssertEqual(response.httpVersion, "1.1")
        XCTAssertEqual(response.json["http_version"], .string("1.1"))
    }

    func testLocalhostNameInTheCertificateIsAccepted() throws {
        let fetcher = try fetcher(caFile: tls.caFile)
        defer { fetcher.shutdown() }
        let url = "https://localhost:\(upstream.port)/text"
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: url)))
        XCTAssertEqual(outcome.response?.status, 200, "\(String(describing: outcome.error))")
    }

    func testUnknownCAFailsWithKindTLS() throws {
        let fetcher = try fetcher(caFile: nil)
        defer { fetcher.shutdown() }
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json"), retries: 2, retryBackoffMs: 1)))
        XCTAssertEqual(outcome.error?.kind, .tls)
        XCTAssertEqual(outcome.attempts, 1, "a TLS failure is not retried")
    }

    func testWrongHostNameFailsWithKindTLS() throws {
        let wrong = try Upstream.start(certificate: tls.wrongName)
        defer { wrong.stop() }
        let fetcher = try fetcher(caFile: tls.caFile)
        defer { fetcher.shutdown() }
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: wrong.url("/json"))))
        XCTAssertEqual(outcome.error?.kind, .tls)
        XCTAssertTrue(outcome.error?.message.contains("127.0.0.1") == true, "\(String(describing: outcome.error))")
    }

    func testPlainHTTPReportsItsVersionToo() throws {
        let plain = try Upstream.start()
        defer { plain.stop() }
        let fetcher = try fetcher(caFile: nil)
        defer { fetcher.shutdown() }
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: plain.url("/json"))))
        XCTAssertEqual(outcome.response?.httpVersion, "1.1")
    }

    func testCAFileWithoutACertificateIsRefused() throws {
        let path = tls.directory + "/not-a-cert.pem"
        try Data("hello".utf8).write(to: URL(fileURLWithPath: path))
        XCTAssertThrowsError(try fetcher(caFile: path)) { error in
            XCTAssertTrue("\(error)".contains("no PEM certificate"), "\(error)")
        }
        XCTAssertThrowsError(try fetcher(caFile: tls.directory + "/missing.pem")) { error in
            XCTAssertTrue("\(error)".contains("cannot read"), "\(error)")
        }
    }
}
