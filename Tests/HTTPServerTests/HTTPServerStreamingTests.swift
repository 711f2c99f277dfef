import Foundation
import XCTest
@testable import HTTPServer
#if canImport(Glibc)
import Glibc
#endif

/// Streamed bodies (`HTTPResponder.startStream`): chunked framing, the connection after the stream, a client that
/// goes away, a client that does not read.
final class HTTPServerStreamingTests: XCTestCase {
    private let eventStream = HTTPResponse(status: 200, headers: HTTPHeaders([("Content-Type", "text/event-stream")]))

    func testStreamedBodyIsChunkedAndTheConnectionServesTheNextRequest() throws {
        let server = try TestServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        let stream = responder.startStream(eventStream)
        XCTAssertTrue(stream.write(Array("data: one\n\n".utf8)))
        let head = try client.readResponse(expectBody: false)
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.header("Transfer-Encoding"), "chunked")
        XCTAssertNil(head.header("Content-Length"))
        XCTAssertEqual(head.header("Content-Type"), "text/event-stream")
        XCTAssertEqual(client.readThrough(Array("\r\n".utf8)).map { String(decoding: $0, as: UTF8.self) }, "b\r\n")
        let done = expectation(description: "written from another thread")
        Thread {
            stream.write(Array("data: two\n\n".utf8))
            stream.finish()
            XCTAssertFalse(stream.write(Array("late".utf8)), "nothing is taken after finish")
            done.fulfill()
        }.start()
        wait(for: [done], timeout: 5)
        let rest = try XCTUnwrap(client.readThrough(Array("0\r\n\r\n".utf8)))
        XCTAssertEqual(String(decoding: rest, as: UTF8.self), "data: one\n\n\r\nb\r\ndata: two\n\n\r\n0\r\n\r\n")
        responder.send(HTTPResponse(status: 500))  // ignored: the stream was the answer
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200)
    }

    func testCurlReadsTheStreamAsItComes() throws {
        let server = try TestServer(extraRoutes: { router in
            router.add("GET", "/ticks") { _, responder in
                let stream = responder.startStream(HTTPResponse(status: 200))
                DispatchQueue.global().async {
                    for k in 0..<5 { stream.write(Array("tick \(k)\n".utf8)) }
                    stream.finish()
                }
            }
        })
        defer { server.stop() }
        let result = try curl(["-sN", "\(server.base)/ticks"])
        XCTAssertEqual(result.stdout, (0..<5).map { "tick \($0)\n" }.joined())
    }

    /// A client that asked for `/pending` over HTTP/1.0, and the stream that answers it.
    private func http10Stream(_ server: TestServer) throws -> (RawClient, HTTPStream) {
        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.0\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        return (client, responder.startStream(eventStream))
    }

    func testHTTP10StreamEndsWithTheConnection() throws {
        let server = try TestServer()
        defer { server.stop() }
        let (client, stream) = try http10Stream(server)
        stream.write(Array("a".utf8))
        stream.write(Array("b".utf8))
        stream.finish()
        let all = String(decoding: try XCTUnwrap(client.readUntilClose()), as: UTF8.self)
        XCTAssertTrue(all.hasSuffix("\r\n\r\nab"), all)
        XCTAssertFalse(all.lowercased().contains("transfer-encoding"), all)
    }

    /// An HTTP/1.0 body has no last chunk: a `finish` that comes after every byte went out has nothing of its own
    /// to write, and the connection still closes.
    func testHTTP10StreamFinishedAfterItsBytesWentOutClosesTheConnection() throws {
        let server = try TestServer()
        defer { server.stop() }
        let (client, stream) = try http10Stream(server)
        stream.write(Array("a".utf8))
        XCTAssertNotNil(client.readThrough(Array("\r\n\r\na".utf8)), "the head and the first byte arrive")
        stream.finish()
        XCTAssertEqual(client.readUntilClose(), [], "closed after the body, with nothing more")
    }

    func testClientThatGoesAwayClosesTheStream() throws {
        let server = try TestServer()
        defer { server.stop() }
        var client: RawClient? = try RawClient(port: server.port)
        try client?.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        let stream = responder.startStream(eventStream)
        let closed = expectation(description: "onClose")
        stream.onClose = { closed.fulfill() }
        stream.write(Array("data: x\n\n".utf8))
        client = nil
        wait(for: [closed], timeout: 5)
        XCTAssertFalse(stream.write(Array("data: y\n\n".utf8)))
        XCTAssertFalse(stream.isOpen)
        server.assertHealthy()
    }

    func testClientThatDoesNotReadIsClosedRatherThanBuffered() throws {
        let server = try TestServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port, receiveBufferBytes: 4096)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        let stream = responder.startStream(eventStream, maxBufferedBytes: 64 * 1024)
        let closed = expectation(description: "onClose")
        stream.onClose = { closed.fulfill() }
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 16 * 1024)
        var writes = 0
        // The socket buffers take a few megabytes at most: the bound is far above what fills them.
        while stream.write(chunk) && writes < 20_000 {
            writes += 1
        }
        XCTAssertLessThan(writes, 20_000, "a client that never reads is let go")
        wait(for: [closed], timeout: 10)
        XCTAssertFalse(stream.isOpen)
        server.assertHealthy()
    }
}

extension HTTPServerStreamingTests {
    func testStreamThatEndsDuringShutdownClosesItsConnection() throws {
        let server = try TestServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        let stream = responder.startStream(HTTPResponse(status: 200))
        XCTAssertEqual(try client.readResponse(expectBody: false).status, 200)
        server.server.beginShutdown()
        stream.write(Array("last".utf8))
        stream.finish()
        let rest = String(decoding: try XCTUnwrap(client.readUntilClose(), "the connection closes"), as: UTF8.self)
        XCTAssertEqual(rest, "4\r\nlast\r\n0\r\n\r\n")
        XCTAssertTrue(server.stop(grace: 5), "nothing left to drain")
    }
}
