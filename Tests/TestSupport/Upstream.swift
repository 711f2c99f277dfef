import Foundation
import JobCore

#if canImport(Glibc)
import Glibc
#endif

/// A failure to launch or talk to the upstream fixture.
public struct UpstreamError: Error, CustomStringConvertible {
    /// What went wrong.
    public var message: String
    /// Wraps a message.
    public init(_ message: String) { self.message = message }
    /// The message.
    public var description: String { message }
}

/// The upstream HTTP fixture (`Tests/Fixtures/upstream.py`) running as a child
/// process on a free loopback port; killed by `stop()` or when released.
public final class Upstream: @unchecked Sendable {
    // @unchecked: `stopped` is read and written only with `lock` held; `scheme` is set by `start` before the
    // fixture is handed out; the other properties are constants.
    /// The port the fixture listens on, on 127.0.0.1.
    public let port: Int
    private let process: Process
    // Kept open: the fixture exits when its stdin closes, so it dies with us even on a crash.
    private let stdinPipe: Pipe
    private let stdoutPipe: Pipe
    private let lock = NSLock()
    private var stopped = false

    /// `http` or, for a fixture started with a certificate, `https`.
    public private(set) var scheme = "http"

    /// `http://127.0.0.1:PORT` (`https://` with a certificate).
    public var baseURL: String { "\(scheme)://127.0.0.1:\(port)" }

    /// The absolute URL of `path` (which starts with `/`) on the fixture.
    public func url(_ path: String) -> String { baseURL + path }

    /// The fixture script, found relative to this source file.
    public static var scriptPath: String {
        let here = URL(fileURLWithPath: #filePath)
        return here.deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/upstream.py").path
    }

    /// Launches the fixture and waits (at most 10 s) for its `listening <port>` line.
    /// - Throws: `UpstreamError` if python3 cannot start or never reports its port.
    /// - Parameter certificate: serve HTTPS with this PEM certificate and key (`TLSMaterial`).
    public static func start(certificate: (cert: String, key: String)? = nil) throws -> Upstream {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", scriptPath, "--port", "0", "--exit-on-stdin-eof"]
        if let certificate { process.arguments? += ["--tls-cert", certificate.cert, "--tls-key", certificate.key] }
        let stdinPipe = Pipe()
        let stdoutPipe = Pipe()
        process.standardInput = stdinPipe
        process.standardOutput = stdoutPipe
        do {
            try process.run()
        } catch {
            throw UpstreamError("cannot launch python3 \(scriptPath): \(error)")
        }
        let fd = stdoutPipe.fileHandleForReading.fileDescriptor
        var line: [UInt8] = []
        let deadline = Date().addingTimeInterval(10)
        while !line.contains(UInt8(ascii: "\n")) {
            let remainingMs = Int32(max(0, deadline.timeIntervalSinceNow * 1000))
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, remainingMs)
            if ready <= 0 {
                process.terminate()
                throw UpstreamError("upstream fixture did not report its port within 10 s")
            }
            var byte: UInt8 = 0
            let n = read(fd, &byte, 1)
            if n <= 0 {
                process.terminate()
                throw UpstreamError("upstream fixture exited before reporting its port")
            }
            line.append(byte)
        }
        let text = String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        let parts = text.split(separator: " ")
        guard parts.count == 2, parts[0] == "listening", let port = Int(parts[1]) else {
            process.terminate()
            throw UpstreamError("unexpected first line from the upstream fixture: \(text)")
        }
        let upstream = Upstream(port: port, process: process, stdinPipe: stdinPipe, stdoutPipe: stdoutPipe)
        if certificate != nil { upstream.scheme = "https" }
        return upstream
    }

    private init(port: Int, process: Process, stdinPipe: Pipe, stdoutPipe: Pipe) {
        self.port = port
        self.process = process
        self.stdinPipe = stdinPipe
        self.stdoutPipe = stdoutPipe
    }

    deinit { stop() }

    /// Kills the fixture and waits for it to exit; idempotent.
    public func stop() {
        lock.lock()
        let wasStopped = stopped
        stopped = true
        lock.unlock()
        if wasStopped { return }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        try? stdinPipe.fileHandleForWriting.close()
        try? stdoutPipe.fileHandleForReading.close()
    }

    /// `GET /stats`: counters, request totals, concurrency high-water marks and disconnects.
    /// - Throws: `UpstreamError` if the fixture does not answer with JSON.
    public func stats() throws -> JSONValue {
        let (status, body) = try Upstream.request(port: port, method: "GET", path: "/stats")
        guard status == 200 else { throw UpstreamError("GET /stats answered \(status)") }
        do {
            return try JSONValue.parse(body)
        } catch {
            throw UpstreamError("GET /stats body is not JSON: \(error)")
        }
    }

    /// Waits (at most `seconds`) until `condition` holds of `GET /stats`, looking again each time the fixture's
    /// counters change (a long-poll on their `generation`), never after a set interval.
    /// - Returns: the stats that satisfied `condition`.
    /// - Throws: `UpstreamError` naming `what` if it does not hold in time, or if the fixture does not answer.
    @discardableResult
    public func waitForStats(
        _ what: String, seconds: Double = 10, _ condition: (JSONValue) throws -> Bool
    ) throws -> JSONValue {
        let deadline = Date().addingTimeInterval(seconds)
        var stats = try self.stats()
        while true {
            if try condition(stats) { return stats }
            let left = deadline.timeIntervalSinceNow
            guard left > 0, let generation = stats["generation"]?.intValue else {
                throw UpstreamError("\(what) did not happen within \(seconds) s")
            }
            // Each wait stays well inside the request's own 5 s receive timeout.
            let wait = String(format: "%.3f", min(left, 3))
            let (status, body) = try Upstream.request(port: port, method: "GET", path: "/stats?after=\(generation)&wait=\(wait)")
            guard status == 200 else { throw UpstreamError("GET /stats answered \(status)") }
            stats = try JSONValue.parse(body)
        }
    }

    /// `POST /stats/reset`: zeroes counters, totals and the disconnect record.
    /// - Throws: `UpstreamError` if the fixture does not answer 200.
    public func resetStats() throws {
        let (status, _) = try Upstream.request(port: port, method: "POST", path: "/stats/reset")
        guard status == 200 else { throw UpstreamError("POST /stats/reset answered \(status)") }
    }

    /// One blocking HTTP/1.1 request with `Connection: close` to 127.0.0.1:`port`
    /// (no libcurl, so the fixture can be inspected independently of the code under test).
    /// - Returns: the status and the body.
    public static func request(port: Int, method: String, path: String, timeoutSeconds: Int = 5) throws -> (Int, [UInt8]) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw UpstreamError("socket: errno \(errno)") }
        defer { close(fd) }
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = in_addr_t(UInt32(0x7f00_0001).bigEndian)
        let connected = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw UpstreamError("connect to 127.0.0.1:\(port): errno \(errno)") }
        let head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        let out = Array(head.utf8)
        var sent = 0
        while sent < out.count {
            let n = out[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw UpstreamError("send: errno \(errno)") }
            sent += n
        }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while response.count < 64 * 1024 * 1024 {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { break }
            guard n > 0 else { throw UpstreamError("recv: errno \(errno)") }
            response.append(contentsOf: buffer[0..<n])
        }
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let end = response.indices.first(where: { response[$0...].starts(with: separator) }) else {
            throw UpstreamError("incomplete response from the upstream fixture")
        }
        let statusLine = String(decoding: response[..<end], as: UTF8.self).split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else {
            throw UpstreamError("bad status line from the upstream fixture")
        }
        return (status, Array(response[(end + 4)...]))
    }
}
