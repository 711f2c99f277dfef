import Foundation
import XCTest
@testable import HTTPServer
#if canImport(Glibc)
import Glibc
#endif

/// Bodies at and around the limits, and responses bigger than the socket buffer.
final class HTTPServerLargeBodyTests: XCTestCase {
    private var server: TestServer!
    private static let bigBody: [UInt8] = (0..<(4 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }

    override func setUpWithError() throws {
        server = try TestServer(configure: { $0.maxRequestBodyBytes = 100_000 }, extraRoutes: { router in
            router.add("GET", "/big") { _, responder in
                responder.send(HTTPResponse(status: 200, body: HTTPServerLargeBodyTests.bigBody))
            }
            router.add("GET", "/pieces") { _, responder in
                // The big body in three arrays: its first byte, a mebibyte, the rest.
                let big = HTTPServerLargeBodyTests.bigBody
                var response = HTTPResponse(status: 200, body: Array(big[..<1]))
                response.bodyPieces = [Array(big[1..<(1 << 20)]), Array(big[(1 << 20)...])]
                responder.send(response)
            }
        })
    }

    override func tearDown() {
        server?.stop()
        server = nil
    }

    func testBodyOfExactlyTheLimitIsAcceptedAndOneMoreByteIs413() throws {
        let client = try RawClient(port: server.port)
        let exact = String(repeating: "q", count: 100_000)
        try client.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n\(exact)")
        let ok = try client.readResponse()
        XCTAssertEqual(ok.status, 200)
        XCTAssertEqual(ok.header("X-Body-Length"), "100000")
        try client.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100001\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 413)
        XCTAssertTrue(client.waitForClose())
    }

    func testChunkedBodyOverTheLimitIs413() throws {
        let client = try RawClient(port: server.port)
        let chunk = String(repeating: "c", count: 60_000)
        let size = String(60_000, radix: 16)
        try client.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\(size)\r\n\(chunk)\r\n\(size)\r\n")
        XCTAssertEqual(try client.readResponse().status, 413)
        XCTAssertTrue(client.waitForClose())
        server.assertHealthy()
    }

    func testLargeCurlUploadArrivesWhole() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("http-up-\(UUID().uuidString)")
        let body = Data((0..<90_000).map { UInt8(truncatingIfNeeded: $0) })
        try body.write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let result = try curl(["-D", "-", "-o", "/dev/null", "--data-binary", "@\(file.path)", "\(server.base)/echo"])
        XCTAssertTrue(result.stdout.contains("X-Body-Length: 90000"), result.stdout)
    }

    func testResponseLargerThanTheSocketBufferIsWrittenWholeThenTheNextPipelinedOne() throws {
        let client = try RawClient(port: server.port, receiveBufferBytes: 4096)
        try client.send("GET /big HTTP/1.1\r\nHost: t\r\n\r\nGET /seq/after HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertTrue(client.waitForUnreadBytes(), "the server's answer never arrived")
        let big = try client.readResponse()
        XCTAssertEqual(big.status, 200)
        XCTAssertEqual(big.body.count, HTTPServerLargeBodyTests.bigBody.count)
        XCTAssertTrue(big.body == HTTPServerLargeBodyTests.bigBody)
        XCTAssertEqual(try client.readResponse().bodyText, "after")
    }

    func testAnAnswerBackedUpOnOneConnectionDoesNotHoldUpAnotherOnTheSameLoop() throws {
        let body = HTTPServerLargeBodyTests.bigBody
        let oneLoop = try TestServer(configure: { $0.eventLoopCount = 1 }, extraRoutes: { router in
            router.add("GET", "/big") { _, responder in responder.send(HTTPResponse(status: 200, body: body)) }
        })
        defer { oneLoop.stop() }
        let slow = try RawClient(port: oneLoop.port, receiveBufferBytes: 4096)
        try slow.send("GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertTrue(slow.waitForUnreadBytes(), "the big answer never arrived")
        // Megabytes of the big answer wait on the loop for a client that does not read; the other connection's
        // small answer is written meanwhile.
        for round in 0..<3 {
            let other = try RawClient(port: oneLoop.port)
            try other.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /seq/\(round) HTTP/1.1\r\nHost: t\r\n\r\n")
            XCTAssertEqual(try other.readResponse().status, 200)
            XCTAssertEqual(try other.readResponse().bodyText, "\(round)")
        }
        let big = try slow.readResponse()
        XCTAssertEqual(big.body.count, body.count)
        XCTAssertTrue(big.body == body)
    }

    func testHalfClosingClientStillReceivesALargeResponse() throws {
        let client = try RawClient(port: server.port, receiveBufferBytes: 4096)
        try client.send("GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(shutdown(client.fd, Int32(SHUT_WR)), 0)
        // The server sees the FIN while most of the body is still queued.
        XCTAssertTrue(client.waitForUnreadBytes(), "the server's answer never arrived")
        let big = try client.readResponse()
        XCTAssertEqual(big.body.count, HTTPServerLargeBodyTests.bigBody.count)
        XCTAssertTrue(client.waitForClose())
        server.assertHealthy()
    }

    func testCurlDownloadsALargeResponse() throws {
        let result = try curl(["-o", "/dev/null", "-w", "%{size_download}", "\(server.base)/big"])
        XCTAssertEqual(result.stdout, String(HTTPServerLargeBodyTests.bigBody.count))
    }

    func testCurlDownloadsAResponseInPiecesWhole() throws {
        let path = NSTemporaryDirectory() + "pieces-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: path) }
        let result = try curl(["-o", path, "-w", "%{size_download}", "\(server.base)/pieces"])
        XCTAssertEqual(result.stdout, String(HTTPServerLargeBodyTests.bigBody.count))
        XCTAssertTrue(try Data(contentsOf: URL(fileURLWithPath: path)) == Data(HTTPServerLargeBodyTests.bigBody))
    }

    func testPipelinedBadRequestAfterAPendingOneIsAnsweredInOrder() throws {
        let client = try RawClient(port: server.port)
        try client.send("GET /later?ms=50 HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        XCTAssertEqual(try client.readResponse().bodyText, "later")
        XCTAssertEqual(try client.readResponse().status, 400)
        XCTAssertTrue(client.waitForClose())
    }
}
