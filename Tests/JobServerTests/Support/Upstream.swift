import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A tiny upstream on 127.0.0.1 for jobs to fetch: `GET /ok` answers `200 {"ok":true}`
/// (application/json); `/hang` reads the request and never answers, until the client
/// goes away or the upstream stops.
final class Upstream: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var clients: [Int32] = []
    private var stopped = false

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw UpstreamError.socket(errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            close(fd)
            throw UpstreamError.socket(errno)
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        listener = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
        Thread { [self] in acceptLoop() }.start()
    }

    /// `http://127.0.0.1:<port><path>`.
    func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    func stop() {
        lock.lock()
        stopped = true
        let open = clients
        clients = []
        lock.unlock()
        Glibc.shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for fd in open { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR { continue }
                return
            }
            lock.lock()
            if stopped {
                lock.unlock()
                close(fd)
                return
            }
            clients.append(fd)
            lock.unlock()
            Thread { [self] in serve(fd) }.start()
        }
    }

    private func serve(_ fd: Int32) {
        defer {
            lock.lock()
            clients.removeAll { $0 == fd }
            lock.unlock()
            close(fd)
        }
        var head: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !String(decoding: head, as: UTF8.self).contains("\r\n\r\n") {
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 || head.count > 65536 { return }
            head.append(contentsOf: chunk[0..<n])
        }
        let requestLine = String(decoding: head, as: UTF8.self).split(separator: "\r\n").first ?? ""
        let parts = requestLine.split(separator: " ")
        let path = parts.count > 1 ? String(parts[1]) : "/"
        if path.hasPrefix("/hang") {
            // Bounded: at most 60 s, then the connection is dropped.
            for _ in 0..<600 {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                if poll(&pfd, 1, 100) != 0 {
                    if read(fd, &chunk, chunk.count) <= 0 { return }
                }
            }
            return
        }
        let body = #"{"ok":true}"#
        let response =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Connection: close\r\n\r\n\(body)"
        let bytes = Array(response.utf8)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }
}

enum UpstreamError: Error {
    case socket(Int32)
}
