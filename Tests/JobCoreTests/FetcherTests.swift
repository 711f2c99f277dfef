import Foundation
import JobCore
import TestSupport
import XCTest

/// Runs one fetch and waits (bounded) for its outcome.
func fetchAndWait(
    _ fetcher: Fetcher, _ request: FetchRequest, timeoutMs: Int? = nil, waitSeconds: Double = 20,
    onAttempt: (@Sendable (Int) -> Void)? = nil, file: StaticString = #filePath, line: UInt = #line
) -> FetchOutcome? {
    let box = OutcomeBox()
    fetcher.start(request, timeoutMs: timeoutMs, onAttempt: onAttempt) { box.set($0) }
    guard let outcome = box.wait(seconds: waitSeconds) else {
        XCTFail("fetch of \(request.url) did not complete within \(waitSeconds) s", file: file, line: line)
        return nil
    }
    return outcome
}

/// Collects outcomes delivered on the fetcher's thread.
final class OutcomeBox: @unchecked Sendable {
    // @unchecked: `outcomes` and `completions` are read and written only with `condition` locked.
    private let condition = NSCondition()
    private var outcomes: [FetchOutcome] = []
    private var completions = 0

    var completionCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return completions
    }

    func set(_ outcome: FetchOutcome) {
        condition.lock()
        outcomes.append(outcome)
        completions += 1
        condition.broadcast()
        condition.unlock()
    }

    func wait(seconds: Double, count: Int = 1) -> FetchOutcome? {
        all(seconds: seconds, count: count)?.first
    }

    func all(seconds: Double, count: Int) -> [FetchOutcome]? {
        let deadline = Date().addingTimeInterval(seconds)
        condition.lock()
        defer { condition.unlock() }
        while outcomes.count < count {
            if !condition.wait(until: deadline) { return nil }
        }
        return outcomes
    }

    var count: Int {
        condition.lock()
        defer { condition.unlock() }
        return outcomes.count
    }
}

extension FetchOutcome {
    var response: FetchResponse? { if case .success(let r) = result { return r } else { return nil } }
    var error: NodeError? { if case .failure(let e) = result { return e } else { return nil } }
}

/// A fetcher with the default configuration and the upstream fixture, fresh for each test.
class FetcherTestCase: XCTestCase {
    var upstream: Upstream!
    var fetcher: Fetcher!

    override func setUpWithError() throws {
        upstream = try Upstream.start()
        fetcher = try Fetcher(configuration: FetcherConfiguration())
    }

    override func tearDown() {
        fetcher?.shutdown()
        upstream?.stop()
        fetcher = nil
        upstream = nil
    }
}

/// Responses, fields, body modes and the error kinds of single fetches.
final class FetcherTests: FetcherTestCase {
    func testJSONResponseReportsEveryField() throws {
        let url = upstream.url("/json")
        let started = Timestamp.monotonicMs()
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: url)))
        let waited = Timestamp.monotonicMs() - started
        let response = try XCTUnwrap(outcome.response)
        XCTAssertEqual(outcome.attempts, 1)
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.body, .object(["ok": true]))
        XCTAssertEqual(response.bodyEncoding, "json")
        XCTAssertEqual(response.bytes, 11)
        XCTAssertEqual(response.rawBody, Array(#"{"ok":true}"#.utf8))
        XCTAssertEqual(response.contentType, "application/json")
        XCTAssertEqual(response.header("Content-Type"), "application/json")
        XCTAssertEqual(response.header("content-length"), "11")
        XCTAssertEqual(response.url, url)
        XCTAssertGreaterThanOrEqual(response.elapsedMs, 0)
        XCTAssertLessThanOrEqual(Int64(response.elapsedMs), waited + 1, "elapsed_ms is in milliseconds")
        let keys = response.json.objectValue?.map(\.key)
        XCTAssertEqual(keys, ["status", "headers", "body", "body_encoding", "bytes", "elapsed_ms", "url", "http_version"])
        XCTAssertEqual(response.json["headers"]?["content-type"], "application/json")
        XCTAssertEqual(fetcher.inFlight, 0)
    }

    func testHeadersAreLowercasedAndRepeatedOnesJoinedInFirstSeenOrder() throws {
        let response = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/headers")))?.response)
        XCTAssertEqual(response.header("set-cookie"), "a=1, b=2")
        XCTAssertEqual(response.header("x-multi"), "one, two")
        XCTAssertEqual(response.header("x-upper"), "UPPER")
        XCTAssertTrue(response.headers.allSatisfy { $0.name == $0.name.lowercased() })
        let names = response.headers.map(\.name)
        XCTAssertEqual(Set(names).count, names.count)
        let order = names.filter { ["set-cookie", "x-multi", "x-upper"].contains($0) }
        XCTAssertEqual(order, ["set-cookie", "x-multi", "x-upper"])
    }

    func testExpectModesReadTheBodyAsAsked() throws {
        func get(_ path: String, _ expect: FetchExpect) throws -> FetchOutcome {
            try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url(path), expect: expect)))
        }
        let text = try XCTUnwrap(get("/text", .text).response)
        XCTAssertEqual(text.body, "hello, world")
        XCTAssertEqual(text.bodyEncoding, "text")
        let autoText = try XCTUnwrap(get("/text", .auto).response)
        XCTAssertEqual(autoText.bodyEncoding, "text")
        XCTAssertEqual(autoText.contentType, "text/plain; charset=utf-8")
        let bytes = try XCTUnwrap(get("/text", .bytes).response)
        XCTAssertEqual(bytes.body, "aGVsbG8sIHdvcmxk")
        XCTAssertEqual(bytes.bodyEncoding, "base64")
        let jsonAsText = try XCTUnwrap(get("/json", .text).response)
        XCTAssertEqual(jsonAsText.body, #"{"ok":true}"#)
        let sized = try XCTUnwrap(get("/json?size=100", .json).response)
        XCTAssertEqual(sized.bytes, 100)
        XCTAssertEqual(sized.bodyEncoding, "json")

        let invalid = try get("/invalid-json", .json)
        XCTAssertEqual(invalid.error?.kind, .invalidJSON)
        XCTAssertEqual(invalid.lastResponse?.rawBody, Array(#"{"broken":"#.utf8))
        // auto reads a body labelled JSON as JSON, so a broken one fails too.
        let invalidAuto = try get("/invalid-json", .auto)
        XCTAssertEqual(invalidAuto.error?.kind, .invalidJSON)
        XCTAssertEqual(invalidAuto.lastResponse?.rawBody, Array(#"{"broken":"#.utf8))

        // 0xab bytes are not UTF-8: auto and text both fall back to base64.
        let binaryAuto = try XCTUnwrap(get("/bytes/3", .auto).response)
        XCTAssertEqual(binaryAuto.body, "q6ur")
        XCTAssertEqual(binaryAuto.bodyEncoding, "base64")
        let binaryText = try XCTUnwrap(get("/bytes/4?type=text/plain", .text).response)
        XCTAssertEqual(binaryText.body, "q6urqw==")
        XCTAssertEqual(binaryText.bodyEncoding, "base64")
        // A "+json" type is JSON too: bytes that are not JSON under it fail.
        let problemJSON = try get("/bytes/2?type=application/problem%2Bjson", .auto)
        XCTAssertEqual(problemJSON.lastResponse?.contentType, "application/problem+json")
        XCTAssertEqual(problemJSON.error?.kind, .invalidJSON)
    }

    func testStatusOutsideSuccessFailsWithHTTPStatusAndKeepsTheResponse() throws {
        let url = upstream.url("/status/503")
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: url)))
        let error = try XCTUnwrap(outcome.error)
        XCTAssertEqual(error.kind, .httpStatus)
        XCTAssertEqual(error.status, 503)
        XCTAssertEqual(error.message, "GET \(url) answered 503")
        XCTAssertNil(error.node)
        XCTAssertEqual(outcome.lastResponse?.status, 503)
        XCTAssertEqual(outcome.lastResponse?.body, .object(["status": 503]))

        let accepted = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/status/404"), acceptStatus: [404])))
        XCTAssertEqual(accepted.response?.status, 404)
        let created = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/status/201"))))
        XCTAssertEqual(created.response?.status, 201)
    }

    func testMethodsHeadersAndBodiesReachTheUpstream() throws {
        let post = FetchRequest(
            url: upstream.url("/echo?a=1"), method: "POST", headers: [("X-Custom", "v1")], body: .json(.object(["n": 1])),
            expect: .json)
        let echoed = try XCTUnwrap(fetchAndWait(fetcher, post)?.response?.body)
        XCTAssertEqual(echoed["method"], "POST")
        XCTAssertEqual(echoed["query"], "a=1")
        XCTAssertEqual(echoed["body"], #"{"n":1}"#)
        XCTAssertEqual(echoed["headers"]?["content-type"], "application/json")
        XCTAssertEqual(echoed["headers"]?["x-custom"], "v1")
        XCTAssertEqual(echoed["headers"]?["user-agent"], "jobserver/1")
        XCTAssertNil(echoed["headers"]?["expect"])

        let put = FetchRequest(url: upstream.url("/echo"), method: "PUT", headers: [("User-Agent", "mine")], body: .text("héllo"))
        let putEcho = try XCTUnwrap(fetchAndWait(fetcher, put)?.response?.body)
        XCTAssertEqual(putEcho["method"], "PUT")
        XCTAssertEqual(putEcho["body"], "héllo")
        XCTAssertEqual(putEcho["headers"]?["user-agent"], "mine")
        // A string body is sent as is: no Content-Type the node did not ask for.
        XCTAssertNil(putEcho["headers"]?["content-type"])

        for method in ["DELETE", "PATCH", "OPTIONS", "POST"] {
            let echo = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/echo"), method: method))?.response?.body)
            XCTAssertEqual(echo["method"]?.stringValue, method)
        }

        let head = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json"), method: "HEAD"))?.response)
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.bytes, 0)
        XCTAssertEqual(head.header("content-length"), "11")
    }

    func testConnectionResetIsAConnectError() throws {
        let error = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/reset")))?.error)
        XCTAssertEqual(error.kind, .connect)
    }

    func testRefusedPortIsAConnectError() throws {
        let port = try closedPort()
        let error = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: "http://127.0.0.1:\(port)/"))?.error)
        XCTAssertEqual(error.kind, .connect)
        XCTAssertTrue(error.message.hasPrefix("GET http://127.0.0.1:\(port)/"), error.message)
    }

    func testUnresolvableHostIsADNSError() throws {
        let error = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: "http://nonexistent.invalid/"))?.error)
        XCTAssertEqual(error.kind, .dns)
    }

    func testSlowResponseTimesOut() throws {
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/delay/3000")), timeoutMs: 200))
        XCTAssertEqual(outcome.error?.kind, .timeout)
    }

    func testEnvironmentProxyIsIgnored() throws {
        let port = try closedPort()
        setenv("http_proxy", "http://127.0.0.1:\(port)", 1)
        setenv("HTTP_PROXY", "http://127.0.0.1:\(port)", 1)
        defer {
            unsetenv("http_proxy")
            unsetenv("HTTP_PROXY")
        }
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json"))))
        XCTAssertEqual(outcome.response?.status, 200)
    }

    func testConfiguredProxyCarriesTheRequest() throws {
        var configuration = FetcherConfiguration()
        configuration.proxy = upstream.baseURL
        let proxied = try Fetcher(configuration: configuration)
        defer { proxied.shutdown() }
        // The fixture answers the absolute-form request as if it were the origin.
        let echo = try XCTUnwrap(fetchAndWait(proxied, FetchRequest(url: "http://origin.invalid/echo"))?.response?.body)
        XCTAssertEqual(echo["path"], "/echo")
        XCTAssertEqual(echo["headers"]?["host"], "origin.invalid")
    }

    func testStatsCountOutcomesAndLatencies() throws {
        _ = fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json")))
        _ = fetchAndWait(fetcher, FetchRequest(url: upstream.url("/status/500")))
        _ = fetchAndWait(fetcher, FetchRequest(url: upstream.url("/invalid-json"), expect: .json))
        let stats = fetcher.stats
        XCTAssertEqual(stats.outcomes["succeeded"], 1)
        XCTAssertEqual(stats.outcomes["http_status"], 1)
        XCTAssertEqual(stats.outcomes["invalid_json"], 1)
        XCTAssertEqual(stats.completed, 3)
        XCTAssertEqual(stats.attempts, 3)
        XCTAssertEqual(stats.latencyCounts.count, FetcherStats.latencyBoundsMs.count + 1)
        XCTAssertEqual(stats.inFlight, 0)
    }

    func testInvalidDenyCIDRsAreRejected() {
        for bad in ["300.1.1.1/8", "10.0.0.0/33", "10.0.0.0/", "nonsense", "fd00::/129", "10.0.0.0/+8"] {
            var configuration = FetcherConfiguration()
            configuration.denyCIDRs = [bad]
            XCTAssertThrowsError(try Fetcher(configuration: configuration), bad)
        }
        var configuration = FetcherConfiguration()
        configuration.denyCIDRs = ["10.0.0.0/8", "fd00::/8", "::1", "192.168.1.1"]
        XCTAssertNoThrow(try Fetcher(configuration: configuration).shutdown())
    }

    func testAddressRangesMatchIPv4IPv6AndMappedAddresses() throws {
        let metadata = try AddressRange(cidr: "169.254.0.0/16")
        XCTAssertTrue(metadata.contains(try XCTUnwrap(AddressRange.parseAddress("169.254.169.254"))))
        XCTAssertFalse(metadata.contains(try XCTUnwrap(AddressRange.parseAddress("169.255.0.1"))))
        XCTAssertTrue(metadata.contains(try XCTUnwrap(AddressRange.parseAddress("::ffff:169.254.1.2"))))
        let unique = try AddressRange(cidr: "fd00::/8")
        XCTAssertTrue(unique.contains(try XCTUnwrap(AddressRange.parseAddress("fd12::1"))))
        XCTAssertFalse(unique.contains(try XCTUnwrap(AddressRange.parseAddress("fe80::1"))))
        XCTAssertFalse(unique.contains(try XCTUnwrap(AddressRange.parseAddress("10.0.0.1"))))
        let odd = try AddressRange(cidr: "10.0.0.0/9")
        XCTAssertTrue(odd.contains([10, 127, 0, 1]))
        XCTAssertFalse(odd.contains([10, 128, 0, 1]))
        XCTAssertTrue(try AddressRange(cidr: "0.0.0.0/0").contains([1, 2, 3, 4]))
    }

    func testShutdownCancelsTransfersAndLaterStartsCompleteCancelled() throws {
        let box = OutcomeBox()
        fetcher.start(FetchRequest(url: upstream.url("/hang"))) { box.set($0) }
        fetcher.shutdown()
        XCTAssertEqual(box.wait(seconds: 5)?.error?.kind, .cancelled)
        let late = OutcomeBox()
        fetcher.start(FetchRequest(url: upstream.url("/json"))) { late.set($0) }
        XCTAssertEqual(late.wait(seconds: 1)?.error?.kind, .cancelled)
        XCTAssertEqual(fetcher.inFlight, 0)
        fetcher.shutdown()
    }
}

/// A loopback port with nothing listening on it.
func closedPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw UpstreamError("socket failed") }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = 0
    addr.sin_addr.s_addr = in_addr_t(UInt32(0x7f00_0001).bigEndian)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
            guard bind(fd, pointer, length) == 0 else { return -1 }
            return getsockname(fd, pointer, &length)
        }
    }
    guard bound == 0 else { throw UpstreamError("bind failed") }
    return Int(UInt16(bigEndian: addr.sin_port))
}
