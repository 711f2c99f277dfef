import Foundation
import XCTest
@testable import HTTPServer
import TestSupport
#if canImport(Glibc)
import Glibc
import Threads
#endif

/// Hostile and unusual clients: pipelining without reading, bodies that trickle in, partial heads,
/// unknown expectations, half-closed sockets waiting on late answers.
final class HTTPServerHardeningTests: XCTestCase {
    private static let blob = [UInt8](repeating: UInt8(ascii: "x"), count: 40 * 1024)

    // MARK: - Backpressure

    func testClientPipeliningTwentyThousandRequestsWithoutReadingCostsBoundedMemoryThenGetsEveryAnswerInOrder() throws {
        let total = 20_000
        let answered = Counter()
        let blocked = DispatchSemaphore(value: 0)
        let server = try TestServer(configure: { $0.onWriteBlocked = { blocked.signal() } }, extraRoutes: { router in
            router.add("GET", "/blob/{n}") { request, responder in
                answered.increment()
                responder.send(HTTPResponse(status: 200, headers: HTTPHeaders([("X-Seq", request.pathParameters["n"] ?? "")]),
                                            body: HTTPServerHardeningTests.blob))
            }
        })
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        var requests: [UInt8] = []
        for i in 0..<total {
            requests.append(contentsOf: Array("GET /blob/\(i) HTTP/1.1\r\nHost: t\r\n\r\n".utf8))
        }
        let baseline = try XCTUnwrap(residentBytes())
        var peak = baseline

        // The writer blocks once the server stops reading, so it runs on its own thread.
        let written = Counter()
        let fd = client.fd
        let writer = Thread { [requests] in
            let deadline = Date().addingTimeInterval(120)
            var offset = 0
            while offset < requests.count && Date() < deadline {
                let n = requests.withUnsafeBytes { buffer -> Int in
                    guard let base = buffer.baseAddress else { return -1 }
                    return Glibc.send(fd, base + offset, min(65_536, requests.count - offset), Int32(MSG_NOSIGNAL))
                }
                if n > 0 {
                    offset += n
                } else if n < 0 && errno != EAGAIN && errno != EINTR {
                    break
                }
            }
            written.add(offset)
            written.finish()
        }
        writer.start()

        // The client reads nothing until the server's writes block on it: from then on the connection parses no
        // more, and the buffers on both sides are as full as they get.
        XCTAssertEqual(blocked.wait(timeout: .now() + 60), .success, "the server's writes never blocked")
        peak = max(peak, residentBytes() ?? 0)
        let answeredUnread = answered.value
        XCTAssertLessThan(answeredUnread, total, "the server stopped parsing while its answers were not read")

        // Now the client reads, streaming, and checks every answer and its order.
        var buffer: [UInt8] = []
        buffer.reserveCapacity(1 << 20)
        var start = 0
        var bodyLeft = 0
        var received = 0
        var failures: [String] = []
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        let readDeadline = Date().addingTimeInterval(300)
        reading: while (received < total || bodyLeft > 0) && Date() < readDeadline {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else {
                failures.append("connection ended or stalled after \(received) answers")
                break
            }
            buffer.append(contentsOf: chunk[0..<n])
            while start < buffer.count {
                if bodyLeft > 0 {
                    let take = min(bodyLeft, buffer.count - start)
                    start += take
                    bodyLeft -= take
                    continue
                }
                guard let end = headEnd(buffer, from: start) else { break }
                let head = String(decoding: buffer[start..<end], as: UTF8.self)
                start = end + 4
                let lines = head.split(separator: "\r\n")
                let sequence = lines.first { $0.hasPrefix("X-Seq: ") }.map { String($0.dropFirst(7)) }
                let length = lines.first { $0.hasPrefix("Content-Length: ") }.flatMap { Int($0.dropFirst(16)) }
                if !(lines.first?.hasPrefix("HTTP/1.1 200") ?? false) || sequence != String(received)
                    || length != HTTPServerHardeningTests.blob.count {
                    failures.append("answer \(received): \(lines.first ?? "") seq \(sequence ?? "none") length \(length ?? -1)")
                    break reading
                }
                bodyLeft = length ?? 0
                received += 1
                if received % 1000 == 0 {
                    peak = max(peak, residentBytes() ?? 0)
                }
            }
            buffer.removeFirst(start)
            start = 0
        }
        XCTAssertEqual(failures, [])
        XCTAssertEqual(received, total)
        XCTAssertEqual(bodyLeft, 0)
        XCTAssertTrue(written.waitUntilFinished(seconds: 30))
        XCTAssertEqual(written.value, requests.count)
        let growth = peak - baseline
        if !rssBoundsMeaningless {
            XCTAssertLessThanOrEqual(growth, 100 << 20, "RSS grew by \(growth >> 20) MiB")
        }
        print("backpressure: \(answeredUnread) answers made before the client read; RSS growth \(growth >> 20) MiB")
    }

    func testClientPipeliningRequestsForLargeAnswersWithoutReadingHasOneMadeAtATime() throws {
        // Far more than the socket buffers take: the first answer's write blocks while the client does not read.
        let body = [UInt8](repeating: UInt8(ascii: "y"), count: 8 << 20)
        let answered = Counter()
        let blocked = DispatchSemaphore(value: 0)
        let server = try TestServer(configure: { $0.onWriteBlocked = { blocked.signal() } }, extraRoutes: { router in
            router.add("GET", "/large/{n}") { request, responder in
                answered.increment()
                responder.send(HTTPResponse(status: 200, headers: HTTPHeaders([("X-Seq", request.pathParameters["n"] ?? "")]),
                                            body: body))
            }
        })
        defer { server.stop() }
        let client = try RawClient(port: server.port, timeoutSeconds: 30, receiveBufferBytes: 64 * 1024)
        try client.send((0..<4).map { "GET /large/\($0) HTTP/1.1\r\nHost: t\r\n\r\n" }.joined())
        XCTAssertEqual(blocked.wait(timeout: .now() + 60), .success, "the server's writes never blocked")
        XCTAssertEqual(answered.value, 1, "the requests behind an unwritten large answer wait for the client to read it")

        for i in 0..<4 {
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 200)
            XCTAssertEqual(response.header("X-Seq"), String(i))
            XCTAssertEqual(response.body.count, body.count)
        }
        XCTAssertEqual(answered.value, 4)
        server.assertHealthy()
    }

    // MARK: - Time limits

    func testBodyTricklingInIsAnswered408AfterTheRequestTimeoutThoughNeverIdle() throws {
        let server = try TestServer { $0.requestTimeoutSeconds = 0.3; $0.headerTimeoutSeconds = 10 }
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        XCTAssertTrue(trickleUntilAnswered(client, bytes: 1000), "answered before the body was complete")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 408)
        XCTAssertEqual(response.header("Content-Type"), "application/json")
        XCTAssertTrue(response.bodyText.hasPrefix(#"{"error":{"code":"request_timeout","message":"#), response.bodyText)
        XCTAssertEqual(response.header("Connection"), "close")
        XCTAssertTrue(client.waitForClose())
        server.assertHealthy()
    }

    func testHeadTricklingInIsAnswered408AfterTheRequestTimeout() throws {
        let server = try TestServer { $0.requestTimeoutSeconds = 0.3; $0.headerTimeoutSeconds = 10 }
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n")
        XCTAssertTrue(trickleUntilAnswered(client, bytes: 1000, byte: UInt8(ascii: "X")))
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 408)
        XCTAssertTrue(response.bodyText.contains(#""code":"request_timeout""#), response.bodyText)
        XCTAssertTrue(client.waitForClose())
    }

    func testPartialHeadThenSilenceIsAnswered408ThenClosed() throws {
        let server = try TestServer { $0.headerTimeoutSeconds = 0.3 }
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 408)
        XCTAssertEqual(response.header("Connection"), "close")
        XCTAssertTrue(response.bodyText.hasPrefix(#"{"error":{"code":"request_timeout","message":"request head not"#),
                      response.bodyText)
        XCTAssertTrue(client.waitForClose())
        server.assertHealthy()
    }

    func testConnectionThatSendsNothingIsClosedWithoutAnAnswer() throws {
        let server = try TestServer { $0.headerTimeoutSeconds = 0.3 }
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        XCTAssertEqual(client.readUntilClose(), [])
    }

    // MARK: - Expect

    func testExpectationOtherThan100ContinueIs417WithoutRunningTheHandler() throws {
        let calls = Counter()
        let server = try TestServer(extraRoutes: { router in
            router.add("POST", "/count") { _, responder in
                calls.increment()
                responder.send(HTTPResponse(status: 200))
            }
        })
        defer { server.stop() }
        for value in ["foo", "100-continue-please", "100-continue, foo", ""] {
            let client = try RawClient(port: server.port)
            try client.send("POST /count HTTP/1.1\r\nHost: t\r\nExpect: \(value)\r\nContent-Length: 5\r\n\r\nhello")
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 417, value)
            XCTAssertTrue(response.bodyText.contains(#""code":"expectation_failed""#), response.bodyText)
            XCTAssertTrue(client.waitForClose(), value)
        }
        XCTAssertEqual(calls.value, 0)
        let client = try RawClient(port: server.port)
        try client.send("POST /count HTTP/1.1\r\nHost: t\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 100, "the expectation's name is case-insensitive")
        try client.send("hello")
        XCTAssertEqual(try client.readResponse().status, 200)
        XCTAssertEqual(calls.value, 1)
    }

    // MARK: - Half-closed clients

    func testHalfClosedClientGetsLateAnswersToGetAndPost() throws {
        let server = try makeLateServer()
        defer { server.stop() }
        for (request, expected) in [
            ("GET /late HTTP/1.1\r\nHost: t\r\n\r\n", "GET "),
            ("POST /late HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody", "POST body"),
            ("POST /late HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "POST abc"),
        ] {
            let client = try RawClient(port: server.port)
            try client.send(request)
            XCTAssertEqual(shutdown(client.fd, Int32(SHUT_WR)), 0)
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 200)
            XCTAssertEqual(response.bodyText, expected)
            XCTAssertTrue(client.waitForClose(), "closed once nothing more is owed")
        }
        server.assertHealthy()
    }

    func testHalfClosedClientGetsEveryPipelinedAnswerInOrder() throws {
        let server = try makeLateServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /late HTTP/1.1\r\nHost: t\r\n\r\n"
            + "POST /late HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\none"
            + "GET /seq/2 HTTP/1.1\r\nHost: t\r\n\r\n"
            + "POST /late?ms=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\ntwo"
            + "GET /late?ms=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(shutdown(client.fd, Int32(SHUT_WR)), 0)
        var bodies: [String] = []
        for _ in 0..<5 {
            bodies.append(try client.readResponse().bodyText)
        }
        XCTAssertEqual(bodies, ["GET ", "POST one", "2", "POST two", "GET "])
        XCTAssertTrue(client.waitForClose())
    }

    func testHalfClosedClientOfAHandlerWatchingForCloseGets102ThenItsAnswer() throws {
        let server = try TestServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        let closed = Counter()
        responder.onClose = { closed.increment() }
        XCTAssertEqual(shutdown(client.fd, Int32(SHUT_WR)), 0)
        XCTAssertEqual(try client.readResponse().status, 102)
        responder.send(HTTPResponse(status: 200, body: Array("answer".utf8)))
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, "answer")
        XCTAssertTrue(client.waitForClose())
        XCTAssertEqual(closed.value, 0)
    }

    // MARK: - Helpers

    /// A server whose `/late` answers from another thread after `ms` (default 30) milliseconds.
    private func makeLateServer() throws -> TestServer {
        try TestServer(extraRoutes: { router in
            let late: HTTPHandler = { request, responder in
                let delay = Double(request.queryValue("ms") ?? "30") ?? 30
                let text = "\(request.method) " + String(decoding: request.body, as: UTF8.self)
                DispatchQueue.global().asyncAfter(deadline: .now() + delay / 1000) {
                    responder.send(HTTPResponse(status: 200, body: Array(text.utf8)))
                }
            }
            router.add("GET", "/late", late)
            router.add("POST", "/late", late)
        })
    }

    /// Sends `byte` one at a time, each followed by up to 100 ms of waiting for an answer.
    /// - Returns: true once an answer is there to read; false if all bytes went out (or 10 s passed) first.
    private func trickleUntilAnswered(_ client: RawClient, bytes: Int, byte: UInt8 = UInt8(ascii: "a")) -> Bool {
        let deadline = Date().addingTimeInterval(10)
        for _ in 0..<bytes where Date() < deadline {
            if client.waitReadable(milliseconds: 100) { return true }
            if (try? client.send([byte])) == nil { return client.waitReadable(milliseconds: 1000) }
        }
        return false
    }

    private func headEnd(_ buffer: [UInt8], from start: Int) -> Int? {
        var i = start
        while i + 3 < buffer.count {
            if buffer[i] == 13 && buffer[i + 1] == 10 && buffer[i + 2] == 13 && buffer[i + 3] == 10 { return i }
            i += 1
        }
        return nil
    }
}

/// This process's resident set (`VmRSS`), in bytes.
func residentBytes() -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        let digits = line.dropFirst(6).filter { $0.isNumber }
        return Int(digits).map { $0 * 1024 }
    }
    return nil
}

/// A count shared between handlers and the test, with a flag for "done".
final class Counter: Sendable {
    private let state = Locked((value: 0, finished: false))
    /// Signalled by the first `finish()`; each wait that takes it gives it back for the next.
    private let finished = DispatchSemaphore(value: 0)

    func increment() { add(1) }
    func add(_ n: Int) { state.withLock { $0.value += n } }
    func finish() {
        let first = state.withLock { state -> Bool in
            defer { state.finished = true }
            return !state.finished
        }
        if first { finished.signal() }
    }
    var value: Int { state.withLock { $0.value } }

    /// Waits (at most `seconds`) for `finish()`.
    func waitUntilFinished(seconds: Double) -> Bool {
        guard finished.wait(timeout: .now() + seconds) == .success else { return false }
        finished.signal()
        return true
    }
}
