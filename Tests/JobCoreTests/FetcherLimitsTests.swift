import Foundation
import JobCore
import TestSupport
import XCTest

/// Body limits, redirects, denied addresses and connection limits.
final class FetcherLimitsTests: FetcherTestCase {
    func testResponseOfExactlyMaxBytesSucceedsAndOneByteMoreFails() throws {
        for chunked in [false, true] {
            let suffix = chunked ? "?chunked=1" : ""
            let exact = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/bytes/1000" + suffix), maxBytes: 1000)))
            XCTAssertEqual(exact.response?.bytes, 1000, "chunked: \(chunked)")
            let over = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/bytes/1001" + suffix), maxBytes: 1000)))
            XCTAssertEqual(over.error?.kind, .tooLarge, "chunked: \(chunked)")
            XCTAssertEqual(over.error?.message.contains("larger than 1000 bytes"), true)
        }
        var small = FetcherConfiguration()
        small.maxResponseBytes = 10
        let limited = try Fetcher(configuration: small)
        defer { limited.shutdown() }
        XCTAssertEqual(fetchAndWait(limited, FetchRequest(url: upstream.url("/json?size=11")))?.error?.kind, .tooLarge)
        XCTAssertEqual(fetchAndWait(limited, FetchRequest(url: upstream.url("/json?size=10")))?.response?.bytes, 10)
    }

    func testHundredMebibyteResponseFailsTooLargeWithFlatMemory() throws {
        let before = try residentKiB()
        let hundredMiB = 100 * 1024 * 1024
        for suffix in ["", "?chunked=1"] {
            let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/bytes/\(hundredMiB)" + suffix))))
            XCTAssertEqual(outcome.error?.kind, .tooLarge, suffix)
        }
        // The largest accepted body (the default 10 MiB) still fits the budget.
        let atLimit = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/bytes/\(10 * 1024 * 1024)?chunked=1"), expect: .bytes)))
        XCTAssertEqual(atLimit.response?.bytes, 10 * 1024 * 1024)
        let after = try residentKiB()
        if !rssBoundsMeaningless {
            XCTAssertLessThan(after - before, 50 * 1024, "RSS grew from \(before) KiB to \(after) KiB")
        }
    }

    func testFiveRedirectsSucceedAndTheSixthFails() throws {
        let five = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/redirect/5"))))
        let response = try XCTUnwrap(five.response)
        XCTAssertEqual(response.body, .object(["redirected": true]))
        XCTAssertEqual(response.url, upstream.url("/redirect/0"))
        XCTAssertNil(response.header("location"))
        let six = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/redirect/6"))))
        XCTAssertEqual(six.error?.kind, .tooManyRedirects)
        XCTAssertEqual(six.error?.message.contains("too many redirects"), true)
    }

    func testRedirectIsReportedAsStatusWhenNotFollowed() throws {
        let url = upstream.url("/redirect/1")
        let refused = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: url, followRedirects: false)))
        XCTAssertEqual(refused.error?.kind, .httpStatus)
        XCTAssertEqual(refused.error?.status, 302)
        let accepted = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: url, acceptStatus: [302], followRedirects: false)))
        XCTAssertEqual(accepted.response?.header("location"), "/redirect/0")
        XCTAssertEqual(accepted.response?.url, url)
    }

    func testRedirectToFileSchemeIsRefused() throws {
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/redirect-to?url=file:///etc/passwd"))))
        XCTAssertEqual(outcome.error?.kind, .connect)
        XCTAssertEqual(outcome.error?.message.contains("refused protocol"), true, outcome.error?.message ?? "")
        let direct = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: "file:///etc/passwd")))
        XCTAssertEqual(direct.error?.kind, .connect)
    }

    func testMetadataAddressIsDeniedBeforeAnyConnection() throws {
        // Refused by the address check that runs before any connect, as its message says.
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: "http://169.254.169.254/latest/meta-data/")))
        XCTAssertEqual(outcome.error?.kind, .connect)
        XCTAssertEqual(outcome.error?.message.contains("address 169.254.169.254 is denied (169.254.0.0/16)"), true, outcome.error?.message ?? "")

        let viaRedirect = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/redirect-to?url=http://169.254.169.254/"))))
        XCTAssertEqual(viaRedirect.error?.kind, .connect)
        XCTAssertEqual(viaRedirect.error?.message.contains("is denied"), true)
    }

    func testLoopbackDenyRangeRefusesTheFixtureWithoutARequest() throws {
        var configuration = FetcherConfiguration()
        configuration.denyCIDRs = ["127.0.0.0/8"]
        let denying = try Fetcher(configuration: configuration)
        defer { denying.shutdown() }
        let outcome = try XCTUnwrap(fetchAndWait(denying, FetchRequest(url: upstream.url("/count/denied"), retries: 3, retryBackoffMs: 1)))
        XCTAssertEqual(outcome.error?.kind, .connect)
        XCTAssertEqual(outcome.error?.message.contains("address 127.0.0.1 is denied (127.0.0.0/8)"), true, outcome.error?.message ?? "")
        XCTAssertEqual(outcome.attempts, 1, "a denied address is not retried")
        let stats = try upstream.stats()
        XCTAssertEqual(stats["requests"]?.intValue, 0)
        XCTAssertNil(stats["counters"]?["denied"])
    }

    func testPerHostLimitCapsConcurrentRequests() throws {
        var configuration = FetcherConfiguration()
        configuration.maxPerHost = 4
        let limited = try Fetcher(configuration: configuration)
        defer { limited.shutdown() }
        let box = OutcomeBox()
        for _ in 0..<40 {
            limited.start(FetchRequest(url: upstream.url("/delay/200"))) { box.set($0) }
        }
        let outcomes = try XCTUnwrap(box.all(seconds: 30, count: 40))
        XCTAssertEqual(outcomes.filter { $0.response?.status == 200 }.count, 40)
        let stats = try upstream.stats()
        let maxActive = try XCTUnwrap(stats["max_active"]?.intValue)
        XCTAssertLessThanOrEqual(maxActive, 4)
        XCTAssertGreaterThanOrEqual(maxActive, 2)
        XCTAssertEqual(stats["requests"]?.intValue, 40)
        XCTAssertEqual(limited.inFlight, 0)
    }
}

/// This process's resident set size, from /proc/self/status.
func residentKiB() throws -> Int {
    let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
    guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    else { throw UpstreamError("no VmRSS in /proc/self/status") }
    return kib
}
