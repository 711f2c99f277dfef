import Foundation
import XCTest
@testable import HTTPServer
import TestSupport
import Threads
#if canImport(Glibc)
import Glibc
#endif

/// Late responses, disconnects, timeouts, many connections and graceful shutdown.
final class HTTPServerLifecycleTests: XCTestCase {

    // MARK: - Responses completed later

    func testResponseCompletedLaterFromAnotherThread() throws {
        let server = try TestServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        // Sent from another thread, whether before or after the handler has returned: both must work.
        let thread = Thread {
            responder.send(HTTPResponse(status: 202, body: Array("done later".utf8)))
            responder.send(HTTPResponse(status: 500))  // ignored: only the first send counts
        }
        thread.start()
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 202)
        XCTAssertEqual(response.bodyText, "done later")
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200, "the second send wrote nothing")
        let later = try curl(["\(server.base)/later?ms=30"])
        XCTAssertEqual(later.stdout, "later")
    }

    func testHandlersRunOnLoopsWithTheTimeSliceTheyAskFor() throws {
        let server = try TestServer(extraRoutes: { router in
            router.add("GET", "/slice") { _, responder in
                let slice = currentThreadTimeSliceNanoseconds().map(String.init) ?? "unknown"
                responder.send(HTTPResponse(status: 200, body: Array(slice.utf8)))
            }
        })
        defer { server.stop() }
        // What a thread that asks for the loops' slice runs with here: the slice itself on Linux 6.12 and later.
        let asked = Locked<String>("")
        let thread = try startThread(name: "slice-ref", sliceMicroseconds: HTTPServer.loopSliceMicroseconds) {
            let slice = currentThreadTimeSliceNanoseconds().map(String.init) ?? "unknown"
            asked.withLock { $0 = slice }
        }
        XCTAssertEqual(pthread_join(thread, nil), 0)
        // Several connections, so that every loop is likely to answer one.
        for _ in 0..<8 {
            XCTAssertEqual(try curl(["\(server.base)/slice"]).stdout, asked.withLock { $0 })
        }
    }

    func testOnCloseIsCalledWhenClientDisconnectsBeforeSend() throws {
        let server = try TestServer()
        defer { server.stop() }
        let closed = expectation(description: "onClose")
        var client: RawClient? = try RawClient(port: server.port)
        try client?.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        responder.onClose = { closed.fulfill() }
        client = nil  // closes the socket
        wait(for: [closed], timeout: 5)
        XCTAssertTrue(responder.isConnectionClosed)
        responder.send(HTTPResponse(status: 200))  // harmless after the close
        server.assertHealthy()
    }

    func testOnResponseReportsPatternMethodStatusAndDuration() throws {
        let seen = ResponseLog()
        let server = try TestServer(configure: { config in
            config.onResponse = { pattern, method, status, nanoseconds in seen.add("\(pattern ?? "nil") \(method) \(status)", nanoseconds) }
        })
        defer { server.stop() }
        _ = try curl(["\(server.base)/items/7"])
        _ = try curl(["\(server.base)/nowhere"])
        _ = try curl(["-X", "PUT", "\(server.base)/healthz"])
        _ = try curl(["\(server.base)/later?ms=20"])
        let entries = seen.entries
        XCTAssertEqual(entries.map { $0.0 }, ["/items/{id} GET 200", "nil GET 404", "/healthz PUT 405", "/later GET 200"])
        XCTAssertGreaterThanOrEqual(entries.last?.1 ?? 0, 15_000_000, "duration includes the handler's wait")
    }

    func testRouterAndStandaloneResponderWorkWithoutSockets() {
        let router = Router()
        router.add("GET", "/v1/jobs/{id}/nodes/{node}") { request, responder in
            responder.send(HTTPResponse(status: 200, body: Array("\(request.pathParameters["id"] ?? "?")/\(request.pathParameters["node"] ?? "?")".utf8)))
        }
        let got = ResponseLog()
        router.route(HTTPRequest(method: "HEAD", target: "/v1/jobs/j1/nodes/root.0"),
                     HTTPResponder { response in got.add(String(decoding: response.body, as: UTF8.self), UInt64(response.status)) })
        router.route(HTTPRequest(method: "POST", target: "/v1/jobs/j1/nodes/x"),
                     HTTPResponder { response in got.add(response.headers["Allow"] ?? "", UInt64(response.status)) })
        router.route(HTTPRequest(method: "GET", target: "/v1/jobs/j1/nodes/"),
                     HTTPResponder { response in got.add("", UInt64(response.status)) })
        XCTAssertEqual(got.entries.map { $0.0 }, ["j1/root.0", "GET, HEAD", ""])
        XCTAssertEqual(got.entries.map { $0.1 }, [200, 405, 404])
    }

    func testManyLateResponsesFromManyThreadsArriveOnTheRightConnections() throws {
        let server = try TestServer()
        defer { server.stop() }
        let failures = ResponseLog()
        let group = DispatchGroup()
        for worker in 0..<16 {
            group.enter()
            Thread {
                defer { group.leave() }
                do {
                    let client = try RawClient(port: server.port)
                    for i in 0..<20 {
                        // Alternate late and immediate answers, pipelined in pairs.
                        try client.send("GET /later?ms=\(i % 5) HTTP/1.1\r\nHost: t\r\n\r\nGET /seq/\(worker)-\(i) HTTP/1.1\r\nHost: t\r\n\r\n")
                        let late = try client.readResponse()
                        let now = try client.readResponse()
                        if late.bodyText != "later" || now.bodyText != "\(worker)-\(i)" {
                            failures.add("worker \(worker) got \(late.bodyText) / \(now.bodyText)", 0)
                        }
                    }
                } catch {
                    failures.add("worker \(worker): \(error)", 0)
                }
            }.start()
        }
        XCTAssertEqual(group.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(failures.entries.map { $0.0 }, [])
    }

    func testRandomGarbageFromManyClientsLeavesTheServerHealthy() throws {
        let server = try TestServer()
        defer { server.stop() }
        var state: UInt64 = 99
        func next() -> UInt64 {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return state >> 33
        }
        for _ in 0..<50 {
            let client = try RawClient(port: server.port, timeoutSeconds: 2)
            let length = Int(next() % 2000) + 1
            let bytes = (0..<length).map { _ in UInt8(truncatingIfNeeded: next()) }
            try? client.send(bytes)
            try? client.send("\r\n\r\n")
            if let response = try? client.readResponse() {
                XCTAssertTrue([400, 404, 405, 413, 414, 431].contains(response.status), "status \(response.status)")
            }
        }
        server.assertHealthy()
    }

    // MARK: - Timeouts and many connections

    func testSlowlorisIsClosedByTheHeaderTimeout() throws {
        let server = try TestServer { $0.headerTimeoutSeconds = 0.5 }
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        let head = Array("GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n".utf8)
        let start = Date()
        var sent = 0
        var closed = false
        for byte in head {
            // One byte every 100 ms, the client's pace: between bytes it waits for the server's answer or close,
            // which ends the wait at once. A send fails (EPIPE/ECONNRESET) once the server has closed.
            if (try? client.send([byte])) == nil { closed = true; break }
            sent += 1
            if client.waitReadable(milliseconds: 100) { closed = client.waitForClose(); break }
            if Date().timeIntervalSince(start) > 3 { break }
        }
        if !closed { closed = client.waitForClose() }
        XCTAssertTrue(closed, "the server closed the slow connection")
        XCTAssertLessThan(sent, head.count, "closed before the head was complete")
        server.assertHealthy()
    }

    func testIdleKeepAliveConnectionIsClosedAfterTheIdleTimeout() throws {
        let server = try TestServer { $0.idleTimeoutSeconds = 0.3 }
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200)
        XCTAssertTrue(client.waitForClose())
    }

    func testThousandIdleConnectionsDoNotStarveAnotherClient() throws {
        raiseOpenFileLimit(to: 4096)
        let server = try TestServer()
        defer { server.stop() }
        var idle: [RawClient] = []
        for i in 0..<1000 {
            let client = try RawClient(port: server.port)
            if i % 2 == 0 {
                try client.send("GET /hea")  // half of them hold a partial request head
            }
            idle.append(client)
        }
        for _ in 0..<20 {
            let result = try curl(["\(server.base)/healthz"])
            XCTAssertEqual(result.stdout, #"{"status":"ok"}"#)
        }
        let keepAlive = try RawClient(port: server.port)
        for _ in 0..<100 {
            try keepAlive.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            XCTAssertEqual(try keepAlive.readResponse().status, 200)
        }
        idle.removeAll()
    }

    func testConnectionsOverMaxConnectionsAreClosedAndOthersServed() throws {
        let server = try TestServer {
            $0.maxConnections = 4
            $0.eventLoopCount = 1
        }
        defer { server.stop() }
        let held = try (0..<4).map { _ in try RawClient(port: server.port) }
        for client in held {
            try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            XCTAssertEqual(try client.readResponse().status, 200)
        }
        let extra = try RawClient(port: server.port)
        XCTAssertTrue(extra.waitForClose())
        try held[0].send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(try held[0].readResponse().status, 200)
    }

    // MARK: - Graceful shutdown

    func testGracefulShutdownLetsAPendingResponseFinishWithinTheGracePeriod() throws {
        let (server, listenersClosed) = try serverReportingClosedListeners()
        let idleClient = try RawClient(port: server.port)
        try idleClient.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(try idleClient.readResponse().status, 200)

        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())

        let finished = expectation(description: "shutdown returned")
        let result = ResponseLog()
        Thread {
            let drained = server.stop(grace: 5)
            result.add(drained ? "drained" : "timed out", 0)
            finished.fulfill()
        }.start()

        XCTAssertTrue(idleClient.waitForClose(), "idle keep-alive connections are closed at once")
        XCTAssertTrue(listenersClosed())
        XCTAssertNil(try? RawClient(port: server.port), "no longer accepting")
        Thread { responder.send(HTTPResponse(status: 200, body: Array("finished in grace".utf8))) }.start()
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, "finished in grace")
        XCTAssertEqual(response.header("Connection"), "close")
        XCTAssertTrue(client.waitForClose())
        wait(for: [finished], timeout: 5)
        XCTAssertEqual(result.entries.first?.0, "drained")
    }

    func testARequestHalfReceivedWhenShutdownBeginsIsStillAnswered() throws {
        let (server, listenersClosed) = try serverReportingClosedListeners()
        let client = try RawClient(port: server.port)
        // A first answer proves the connection is accepted before the shutdown.
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200)
        try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n")
        let finished = expectation(description: "shutdown returned")
        Thread {
            _ = server.stop(grace: 3)
            finished.fulfill()
        }.start()
        XCTAssertTrue(listenersClosed())
        XCTAssertNil(try? RawClient(port: server.port), "no longer accepting")
        try client.send("\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.header("Connection"), "close")
        wait(for: [finished], timeout: 5)
    }

    func testShutdownGivesUpAfterTheGracePeriodAndReportsTheClose() throws {
        let server = try TestServer()
        let client = try RawClient(port: server.port)
        try client.send("GET /pending HTTP/1.1\r\nHost: t\r\n\r\n")
        let responder = try XCTUnwrap(server.pending.take())
        let closed = expectation(description: "onClose")
        responder.onClose = { closed.fulfill() }
        let start = Date()
        XCTAssertFalse(server.stop(grace: 0.3))
        let elapsed = Date().timeIntervalSince(start)
        XCTAssertGreaterThanOrEqual(elapsed, 0.25)
        wait(for: [closed], timeout: 2)
        XCTAssertTrue(client.waitForClose())
    }

    /// A server whose two loops report closing their listeners, each when it sees the shutdown, and a wait (at most
    /// 5 s each) for both: after it, a connect is refused.
    private func serverReportingClosedListeners() throws -> (TestServer, () -> Bool) {
        let loops = 2
        let closed = DispatchSemaphore(value: 0)
        let server = try TestServer(configure: {
            $0.eventLoopCount = loops
            $0.onListenerClosed = { closed.signal() }
        })
        return (server, { (0..<loops).allSatisfy { _ in closed.wait(timeout: .now() + 5) == .success } })
    }

    func testStartingTwiceIsRefusedAndShutdownWithoutStartReturns() throws {
        let server = try TestServer()
        XCTAssertThrowsError(try server.server.start())
        server.stop()
        let unstarted = HTTPServer(configuration: HTTPServerConfiguration(), router: Router())
        XCTAssertTrue(unstarted.shutdown(gracePeriodSeconds: 0.1))
    }

    func testSecondServerOnTheSamePortFailsWithAddressInUse() throws {
        let first = try TestServer()
        defer { first.stop() }
        var configuration = HTTPServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = first.port
        XCTAssertThrowsError(try HTTPServer(configuration: configuration, router: Router()).start()) { error in
            let serverError = error as? HTTPServerError
            XCTAssertEqual(serverError?.kind, .systemCall)
            XCTAssertEqual(serverError?.call, "bind")
            XCTAssertEqual(serverError?.errno, EADDRINUSE)
        }
        first.assertHealthy()
    }

    func testRestartOnTheSameFixedPortWorks() throws {
        let first = try TestServer()
        let port = first.port
        XCTAssertEqual(try curl(["\(first.base)/healthz"]).stdout, #"{"status":"ok"}"#)
        first.stop()
        let second = try TestServer { $0.port = port }
        defer { second.stop() }
        XCTAssertEqual(second.port, port)
        second.assertHealthy()
    }

    func testInvalidHostIsAnError() {
        var configuration = HTTPServerConfiguration()
        configuration.host = "not an address"
        configuration.port = 0
        XCTAssertThrowsError(try HTTPServer(configuration: configuration, router: Router()).start()) { error in
            XCTAssertEqual((error as? HTTPServerError)?.kind, .invalidAddress)
        }
    }

    private func raiseOpenFileLimit(to wanted: rlim_t) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < wanted else { return }
        limit.rlim_cur = min(wanted, limit.rlim_max)
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}

/// A thread-safe list of (text, number) pairs that callbacks record into.
final class ResponseLog: @unchecked Sendable {
    // @unchecked: `stored` is read and written only with `lock` held.
    private let lock = NSLock()
    private var stored: [(String, UInt64)] = []

    func add(_ text: String, _ number: UInt64) {
        lock.lock()
        stored.append((text, number))
        lock.unlock()
    }

    var entries: [(String, UInt64)] {
        lock.lock()
        defer { lock.unlock() }
        return stored
    }
}
