import XCTest
@testable import HTTPServer

/// The parser fed whole, one byte at a time and in random splits must report the same events.
final class HTTPRequestParserTests: XCTestCase {
    private let limits = HTTPParserLimits(maxHeaderBytes: 1024, maxTargetBytes: 256, maxBodyBytes: 4096)

    /// A deterministic generator so failures reproduce.
    private struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// Feeds `chunks` and describes every event; stops after a failure.
    private func events(_ chunks: [[UInt8]], limits: HTTPParserLimits? = nil) -> [String] {
        var parser = HTTPRequestParser(limits: limits ?? self.limits)
        var out: [String] = []
        for chunk in chunks {
            var offset = 0
            while offset < chunk.count {
                let (used, event) = parser.parse(Array(chunk[offset...]))
                XCTAssertTrue(used > 0 || event != nil, "no progress")
                offset += used
                guard let event = event else { continue }
                switch event {
                case .continueExpected:
                    out.append("continue")
                case .request(let parsed):
                    let r = parsed.request
                    let headers = r.headers.map { "\($0.0)=\($0.1)" }.joined(separator: ",")
                    out.append("\(r.method) \(r.target) path=\(r.path) query=\(r.query ?? "nil") \(r.version) "
                        + "keepAlive=\(parsed.keepAlive) headers=[\(headers)] body=\(String(decoding: r.body, as: UTF8.self))")
                case .failure(let error):
                    out.append("error \(error.status) \(error.code)")
                    return out
                }
            }
        }
        return out
    }

    private func assertSplitInvariant(_ input: String, file: StaticString = #filePath, line: UInt = #line) -> [String] {
        let bytes = Array(input.utf8)
        let whole = events([bytes])
        XCTAssertFalse(whole.isEmpty, "no event for \(input.debugDescription)", file: file, line: line)
        XCTAssertEqual(events(bytes.map { [$0] }), whole, "byte by byte", file: file, line: line)
        var rng = SplitMix(state: 42)
        for _ in 0..<50 {
            var chunks: [[UInt8]] = []
            var index = 0
            while index < bytes.count {
                let size = Int.random(in: 1...max(1, min(40, bytes.count - index)), using: &rng)
                chunks.append(Array(bytes[index..<(index + size)]))
                index += size
            }
            XCTAssertEqual(events(chunks), whole, "random split", file: file, line: line)
        }
        return whole
    }

    private static let corpus: [String] = [
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /v1/jobs?limit=5&state=running HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
        "GET http://example.com/v1/jobs?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "\r\nGET / HTTP/1.1\nHost: lf-only\n\n",
        "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET / HTTP/1.1\r\nAccept: x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -3\r\n\r\nabc",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhelloXX\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999\r\n\r\n",
        "GARBAGE\r\n\r\n",
        "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
        "GET /" + String(repeating: "a", count: 300) + " HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + String(repeating: "b", count: 1100) + "\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue-please\r\nContent-Length: 3\r\n\r\nabc",
        "GET / HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-CONTINUE\r\nContent-Length: 3\r\n\r\nabc",
    ]

    func testCorpusGivesIdenticalEventsWholeByteByByteAndInRandomSplits() {
        for input in HTTPRequestParserTests.corpus {
            _ = assertSplitInvariant(input)
        }
    }

    func testSimpleGetIsParsedIntoMethodPathQueryAndHeaders() {
        var parser = HTTPRequestParser(limits: limits)
        let (_, event) = parser.parse(Array("GET /a/b?x=1&y=%20z HTTP/1.1\r\nHost: h\r\nX-A:  spaced value \r\n\r\n".utf8))
        guard case .request(let parsed)? = event else { return XCTFail("no request: \(String(describing: event))") }
        XCTAssertEqual(parsed.request.method, "GET")
        XCTAssertEqual(parsed.request.path, "/a/b")
        XCTAssertEqual(parsed.request.query, "x=1&y=%20z")
        XCTAssertEqual(parsed.request.queryValue("y"), " z")
        XCTAssertEqual(parsed.request.headers["x-a"], "spaced value")
        XCTAssertEqual(parsed.request.version, .http1_1)
        XCTAssertTrue(parsed.keepAlive)
        XCTAssertTrue(parser.isIdle)
    }

    func testPipelinedRequestsAreReportedOneAtATimeLeavingTheRest() {
        var parser = HTTPRequestParser(limits: limits)
        let bytes = Array("GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n".utf8)
        let (used, event) = parser.parse(bytes)
        guard case .request(let first)? = event else { return XCTFail("no first request") }
        XCTAssertEqual(first.request.path, "/1")
        XCTAssertEqual(used, bytes.count / 2)
        let (used2, event2) = parser.parse(Array(bytes[used...]))
        guard case .request(let second)? = event2 else { return XCTFail("no second request") }
        XCTAssertEqual(second.request.path, "/2")
        XCTAssertEqual(used + used2, bytes.count)
    }

    func testChunkedBodyWithExtensionsAndTrailersIsDecoded() {
        let result = assertSplitInvariant(HTTPRequestParserTests.corpus[3])
        XCTAssertEqual(result.count, 1)
        XCTAssertTrue(result[0].hasSuffix("body=hello world"), result[0])
        XCTAssertFalse(result[0].contains("X-Trailer"), "trailers are not merged into the headers")
    }

    func testExpectContinueIsReportedBeforeTheBody() {
        let result = assertSplitInvariant(HTTPRequestParserTests.corpus[4])
        XCTAssertEqual(result.first, "continue")
        XCTAssertTrue(result.last?.hasSuffix("body=abc") ?? false)
        XCTAssertEqual(assertSplitInvariant(HTTPRequestParserTests.corpus[26]).first, "continue",
                       "the expectation's name is case-insensitive")
    }

    func testAbsoluteFormTargetIsReducedToItsPath() {
        let result = assertSplitInvariant(HTTPRequestParserTests.corpus[5])
        XCTAssertTrue(result[0].contains("path=/v1/jobs query=x=1"), result[0])
        XCTAssertEqual(splitTarget("http://host")?.path, "/")
        XCTAssertEqual(splitTarget("HTTPS://host?q")?.path, "/")
        XCTAssertNil(splitTarget("ftp://host/x"))
        XCTAssertNil(splitTarget("relative"))
    }

    func testHTTP10ClosesUnlessKeepAliveIsAsked() {
        let result = assertSplitInvariant(HTTPRequestParserTests.corpus[6])
        XCTAssertEqual(result.count, 2)
        XCTAssertTrue(result[0].contains("http1_0 keepAlive=false"), result[0])
        XCTAssertTrue(result[1].contains("http1_0 keepAlive=true"), result[1])
    }

    func testConnectionCloseEndsKeepAlive() {
        let r = events([Array("GET / HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n".utf8)])
        XCTAssertTrue(r[0].contains("keepAlive=false"), r[0])
    }

    func testLeadingEmptyLineAndBareLFAreAccepted() {
        let result = assertSplitInvariant(HTTPRequestParserTests.corpus[7])
        XCTAssertTrue(result[0].hasPrefix("GET / path=/"), result[0])
    }

    func testBadInputGivesTheExpectedStatus() {
        let expectations: [(Int, String)] = [
            (8, "error 400 bad_request"),   // two Host
            (9, "error 400 bad_request"),   // no Host
            (10, "error 400 bad_request"),  // space before colon
            (11, "error 400 bad_request"),  // CL + TE
            (12, "error 400 bad_request"),  // negative CL
            (13, "error 400 bad_request"),  // conflicting CL
            (15, "error 400 bad_request"),  // bad chunk size
            (16, "error 400 bad_request"),  // chunk longer than declared
            (17, "error 400 bad_request"),  // unsupported TE
            (18, "error 413 payload_too_large"),
            (19, "error 400 bad_request"),  // bad request line
            (20, "error 400 bad_request"),  // HTTP/2.0 request line
            (21, "error 414 uri_too_long"),
            (22, "error 431 headers_too_large"),
            (23, "error 400 bad_request"),  // obs-fold
            (24, "error 417 expectation_failed"),
            (25, "error 417 expectation_failed"),  // without a body too
        ]
        for (index, expected) in expectations {
            let result = assertSplitInvariant(HTTPRequestParserTests.corpus[index])
            XCTAssertEqual(result.last, expected, HTTPRequestParserTests.corpus[index].debugDescription)
        }
        let identical = assertSplitInvariant(HTTPRequestParserTests.corpus[14])
        XCTAssertTrue(identical[0].hasSuffix("body=abc"), "identical repeated lengths are allowed")
    }

    func testTargetTooLongIs414EvenWhenLineNeverEnds() {
        let r = events([Array(("GET /" + String(repeating: "x", count: 2000)).utf8)])
        XCTAssertEqual(r, ["error 414 uri_too_long"])
    }

    func testManySmallHeadersOverTheLimitAre431() {
        var text = "GET / HTTP/1.1\r\nHost: a\r\n"
        for i in 0..<200 { text += "X-\(i): v\r\n" }
        XCTAssertEqual(events([Array((text + "\r\n").utf8)]), ["error 431 headers_too_large"])
    }

    func testChunkedBodyOverLimitIs413() {
        let text = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1001\r\n"
        XCTAssertEqual(events([Array(text.utf8)]), ["error 413 payload_too_large"])
    }

    func testParserStaysFailedAfterAnError() {
        var parser = HTTPRequestParser(limits: limits)
        _ = parser.parse(Array("BAD\r\n".utf8))
        let (used, event) = parser.parse(Array("GET / HTTP/1.1\r\nHost: a\r\n\r\n".utf8))
        XCTAssertNil(event)
        XCTAssertEqual(used, 27)
    }

    func testQueryItemsArePercentDecodedWithPlusAsSpace() {
        let request = HTTPRequest(method: "GET", target: "/x?a=1+2&b=%2Fc%zz&flag&a=3")
        let items = request.queryItems()
        XCTAssertEqual(items.map { $0.name }, ["a", "b", "flag", "a"])
        XCTAssertEqual(items.map { $0.value }, ["1 2", "/c%zz", "", "3"])
        XCTAssertEqual(request.queryValue("a"), "1 2")
        XCTAssertNil(request.queryValue("missing"))
    }

    func testHeadersCompareNamesCaseInsensitively() {
        var headers = HTTPHeaders([("Content-Type", "a"), ("X-Multi", "1"), ("x-multi", "2")])
        XCTAssertEqual(headers["content-type"], "a")
        XCTAssertEqual(headers.values("X-MULTI"), ["1", "2"])
        headers.set("x-multi", "3")
        XCTAssertEqual(headers.values("X-Multi"), ["3"])
        headers.remove("CONTENT-TYPE")
        XCTAssertFalse(headers.contains("content-type"))
        XCTAssertFalse(asciiCaseInsensitiveEquals("a-", "A\r"))
    }

    func testRandomAndMutatedInputNeverCrashesAndAlwaysMakesProgress() {
        var rng = SplitMix(state: 7)
        let seeds = HTTPRequestParserTests.corpus.map { Array($0.utf8) }
        let alphabet = Array("GET POST /?:\r\n\t 0123456789abcdefHTTP/1.1Host:Content-Length:Transfer-Encoding: chunked;".utf8)
        for round in 0..<3000 {
            var bytes: [UInt8]
            if round % 3 == 0 {
                bytes = (0..<Int.random(in: 0...300, using: &rng)).map { _ in
                    alphabet[Int.random(in: 0..<alphabet.count, using: &rng)]
                }
            } else {
                bytes = seeds[Int.random(in: 0..<seeds.count, using: &rng)]
                for _ in 0..<Int.random(in: 1...6, using: &rng) where !bytes.isEmpty {
                    let at = Int.random(in: 0..<bytes.count, using: &rng)
                    switch Int.random(in: 0..<3, using: &rng) {
                    case 0: bytes[at] = UInt8.random(in: 0...255, using: &rng)
                    case 1: bytes.remove(at: at)
                    default: bytes.insert(alphabet[Int.random(in: 0..<alphabet.count, using: &rng)], at: at)
                    }
                }
            }
            var parser = HTTPRequestParser(limits: limits)
            var offset = 0
            var steps = 0
            while offset < bytes.count && steps < 10_000 {
                let size = Int.random(in: 1...max(1, bytes.count - offset), using: &rng)
                let (used, event) = parser.parse(Array(bytes[offset..<(offset + size)]))
                XCTAssertTrue(used > 0 || event != nil)
                XCTAssertLessThanOrEqual(used, size)
                offset += used
                steps += 1
            }
        }
    }
}
