import Foundation
import TestSupport
import Threads
import XCTest
@testable import HTTPServer
#if canImport(Glibc)
import Glibc
#endif

/// A response read off a raw socket.
struct RawResponse {
    var status: Int
    var headers: [(String, String)]
    var body: [UInt8]

    func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }
    var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// A blocking TCP client on 127.0.0.1 for what curl won't send; every read has a timeout.
final class RawClient {
    let fd: Int32
    private var buffer: [UInt8] = []

    /// - Parameter receiveBufferBytes: a small receive buffer makes the server's writes back up.
    init(port: Int, timeoutSeconds: Int = 5, receiveBufferBytes: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw RawClientError("socket: errno \(errno)") }
        if var size = receiveBufferBytes {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let code = errno
            Glibc.close(fd)
            throw RawClientError("connect: errno \(code)")
        }
    }

    deinit { Glibc.close(fd) }

    func send(_ text: String) throws {
        try send(Array(text.utf8))
    }

    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { buffer -> Int in
                guard let base = buffer.baseAddress else { return -1 }
                return Glibc.send(fd, base + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            }
            guard n > 0 else { throw RawClientError("send: errno \(errno)") }
            offset += n
        }
    }

    /// Waits (at most 5 s) until the kernel holds received bytes that nobody has read: with a small receive buffer,
    /// proof that the server's writes are backing up. False if the server closes or the time passes first.
    func waitForUnreadBytes() -> Bool {
        guard waitReadable(milliseconds: 5000) else { return false }
        // Readable is also what a close looks like: bytes must be there.
        var queued: Int32 = 0
        return ioctl(fd, UInt(FIONREAD), &queued) == 0 && queued > 0
    }

    /// Reads more bytes into the buffer; false on EOF, error or timeout.
    private func fill() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard n > 0 else { return false }
        buffer.append(contentsOf: chunk[0..<n])
        return true
    }

    /// Reads one response; `expectBody: false` for HEAD.
    func readResponse(expectBody: Bool = true) throws -> RawResponse {
        var headEnd = findHeadEnd()
        while headEnd == nil {
            if !fill() { throw RawClientError("connection closed before a response head") }
            headEnd = findHeadEnd()
        }
        guard let end = headEnd else { throw RawClientError("no response head") }
        let head = String(decoding: buffer[0..<end], as: UTF8.self)
        buffer.removeFirst(end + 4)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst()
        let parts = statusLine.split(separator: " ")
        guard parts.count >= 2, let status = Int(parts[1]) else { throw RawClientError("bad status line \(statusLine)") }
        var headers: [(String, String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        var response = RawResponse(status: status, headers: headers, body: [])
        if expectBody, status >= 200, status != 204, status != 304 {
            let length = Int(response.header("Content-Length") ?? "0") ?? 0
            while buffer.count < length {
                if !fill() { throw RawClientError("connection closed inside a body") }
            }
            response.body = Array(buffer[0..<length])
            buffer.removeFirst(length)
        }
        return response
    }

    /// True when the server closes the connection (EOF or reset) within the socket timeout,
    /// after discarding any bytes still arriving.
    func waitForClose() -> Bool {
        buffer.removeAll()
        while true {
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return true }
            if n < 0 { return errno == ECONNRESET }
        }
    }

    /// Waits up to `milliseconds` for bytes (or EOF) to read; true if there are some.
    func waitReadable(milliseconds: Int32) -> Bool {
        if !buffer.isEmpty { return true }
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, milliseconds) == 1
    }

    /// Everything the server sends until it closes (EOF or reset); nil if the socket timeout passes first.
    func readUntilClose() -> [UInt8]? {
        var received = buffer
        buffer.removeAll()
        while true {
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return received }
            if n < 0 { return errno == ECONNRESET ? received : nil }
            received.append(contentsOf: chunk[0..<n])
        }
    }

    /// The bytes up to and including `marker` (e.g. the last chunk of a streamed body); nil if the connection
    /// closes or the socket timeout passes first.
    func readThrough(_ marker: [UInt8]) -> [UInt8]? {
        while true {
            if buffer.count >= marker.count {
                for i in 0...(buffer.count - marker.count) where buffer[i..<(i + marker.count)].elementsEqual(marker) {
                    let out = Array(buffer[0..<(i + marker.count)])
                    buffer.removeFirst(i + marker.count)
                    return out
                }
            }
            if !fill() { return nil }
        }
    }

    /// Whether unread bytes are buffered (for "no more responses" checks).
    var hasBufferedBytes: Bool { !buffer.isEmpty }

    private func findHeadEnd() -> Int? {
        guard buffer.count >= 4 else { return nil }
        for i in 0...(buffer.count - 4) where buffer[i] == 13 && buffer[i + 1] == 10 && buffer[i + 2] == 13 && buffer[i + 3] == 10 {
            return i
        }
        return nil
    }
}

struct RawClientError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The result of running /usr/bin/curl.
struct CurlResult {
    var exitCode: Int32
    var stdout: String
    var stderr: String
}

/// Runs curl with `arguments` (bounded by `--max-time`).
func curl(_ arguments: [String]) throws -> CurlResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    process.arguments = ["-s", "--max-time", "10"] + arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    let errData = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return CurlResult(exitCode: process.terminationStatus, stdout: String(decoding: outData, as: UTF8.self),
                      stderr: String(decoding: errData, as: UTF8.self))
}

/// Holds responders that tests complete later.
final class ResponderBox: @unchecked Sendable {
    // @unchecked: `responders` is read and written only with `condition` locked.
    private let condition = NSCondition()
    private var responders: [HTTPResponder] = []

    func put(_ responder: HTTPResponder) {
        condition.lock()
        responders.append(responder)
        condition.signal()
        condition.unlock()
    }

    /// The first responder put, waiting for one at most `timeoutSeconds`.
    func take(timeoutSeconds: Double = 5) -> HTTPResponder? {
        let deadline = Date().addingTimeInterval(timeoutSeconds)
        condition.lock()
        defer { condition.unlock() }
        while responders.isEmpty {
            guard condition.wait(until: deadline) else { break }
        }
        return responders.isEmpty ? nil : responders.removeFirst()
    }
}

/// A started server with the routes the tests use, on 127.0.0.1 and a free port. Tests stop it from other threads.
final class TestServer: Sendable {
    let server: HTTPServer
    let port: Int
    let pending = ResponderBox()
    private let stopped = Locked(false)

    init(configure: (inout HTTPServerConfiguration) -> Void = { _ in }, extraRoutes: (Router) -> Void = { _ in }) throws {
        var configuration = HTTPServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configure(&configuration)
        let router = Router()
        let json = HTTPHeaders([("Content-Type", "application/json")])
        router.add("GET", "/healthz") { _, responder in
            responder.send(HTTPResponse(status: 200, headers: json, body: Array(#"{"status":"ok"}"#.utf8)))
        }
        router.add("POST", "/echo") { request, responder in
            var headers = HTTPHeaders()
            headers.add("X-Body-Length", String(request.body.count))
            responder.send(HTTPResponse(status: 200, headers: headers, body: request.body))
        }
        router.add("GET", "/echo-target") { request, responder in
            let text = "\(request.method) \(request.path) \(request.query ?? "-")"
            responder.send(HTTPResponse(status: 200, body: Array(text.utf8)))
        }
        router.add("GET", "/items/{id}") { request, responder in
            let text = "item \(request.pathParameters["id"] ?? "?") \(request.routePattern ?? "?")"
            responder.send(HTTPResponse(status: 200, body: Array(text.utf8)))
        }
        router.add("GET", "/seq/{n}") { request, responder in
            responder.send(HTTPResponse(status: 200, body: Array((request.pathParameters["n"] ?? "").utf8)))
        }
        let box = pending
        router.add("GET", "/pending") { _, responder in box.put(responder) }
        router.add("GET", "/later") { request, responder in
            let delay = Double(request.queryValue("ms") ?? "50") ?? 50
            DispatchQueue.global().asyncAfter(deadline: .now() + delay / 1000) {
                responder.send(HTTPResponse(status: 200, body: Array("later".utf8)))
            }
        }
        extraRoutes(router)
        server = HTTPServer(configuration: configuration, router: router)
        port = try server.start()
    }

    var base: String { "http://127.0.0.1:\(port)" }

    @discardableResult
    func stop(grace: Double = 2) -> Bool {
        let first = stopped.withLock { stopped in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return true }
        return server.shutdown(gracePeriodSeconds: grace)
    }

    deinit { stop() }

    /// Asserts that /healthz answers 200 on a fresh connection.
    func assertHealthy(file: StaticString = #filePath, line: UInt = #line) {
        do {
            let client = try RawClient(port: port)
            try client.send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 200, file: file, line: line)
            XCTAssertEqual(response.bodyText, #"{"status":"ok"}"#, file: file, line: line)
        } catch {
            XCTFail("healthz failed: \(error)", file: file, line: line)
        }
    }
}
