// STAND-IN for module HTTPServer's `HTTPServer`: a blocking, thread-per-connection,
// one-request-per-connection server, just enough to run JobServer end to end before
// the real server lands. Dropped at merge.
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Stand-in: the HTTP server.
public final class HTTPServer: @unchecked Sendable {
    private let configuration: HTTPServerConfiguration
    private let router: Router
    private let lock = NSLock()
    private var listener: Int32 = -1
    private var stopping = false
    private var open = 0

    public init(configuration: HTTPServerConfiguration, router: Router) {
        self.configuration = configuration
        self.router = router
    }

    public func start() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw StubServerError(message: "socket failed") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(configuration.port).bigEndian)
        inet_pton(AF_INET, configuration.host, &addr.sin_addr)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            close(fd)
            throw StubServerError(message: "bind/listen failed: errno \(errno)")
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        listener = fd
        let thread = Thread { [self] in acceptLoop(fd) }
        thread.start()
        return Int(UInt16(bigEndian: addr.sin_port))
    }

    public func beginShutdown() {
        lock.lock()
        stopping = true
        let fd = listener
        listener = -1
        lock.unlock()
        if fd >= 0 {
            Glibc.shutdown(fd, Int32(SHUT_RDWR))
            close(fd)
        }
    }

    public func shutdown(gracePeriodSeconds: Double) -> Bool {
        beginShutdown()
        let deadline = Date().addingTimeInterval(gracePeriodSeconds)
        while Date() < deadline {
            lock.lock()
            let n = open
            lock.unlock()
            if n == 0 { return true }
            usleep(10_000)
        }
        return false
    }

    private func acceptLoop(_ fd: Int32) {
        while true {
            let client = accept(fd, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                return
            }
            lock.lock()
            open += 1
            lock.unlock()
            let thread = Thread { [self] in
                serve(client)
                lock.lock()
                open -= 1
                lock.unlock()
            }
            thread.start()
        }
    }

    private func serve(_ fd: Int32) {
        let started = DispatchTime.now().uptimeNanoseconds
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var headerEnd: Int?
        while headerEnd == nil {
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { close(fd); return }
            buffer.append(contentsOf: chunk[0..<n])
            headerEnd = Self.find(Array("\r\n\r\n".utf8), in: buffer)
            if headerEnd == nil && buffer.count > configuration.maxHeaderBytes { close(fd); return }
        }
        guard let end = headerEnd else { close(fd); return }
        let head = String(decoding: buffer[0..<end], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst().split(separator: " ")
        guard requestLine.count == 3 else { close(fd); return }
        var headers = HTTPHeaders()
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.add(String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        let method = String(requestLine[0])
        let target = String(requestLine[1])
        let responder = HTTPResponder { [self] response in
            var response = response
            if method == "HEAD" { response.headers.set("Content-Length", String(response.body.count)); response.body = [] }
            write(fd, response, isHead: method == "HEAD")
            close(fd)
        }
        func answer(_ status: Int, _ route: String?, _ response: HTTPResponse) {
            responder.send(response)
            configuration.onResponse?(route, method, status, DispatchTime.now().uptimeNanoseconds - started)
        }
        if length > configuration.maxRequestBodyBytes {
            answer(413, nil, Self.error(413, "payload_too_large", "request body over \(configuration.maxRequestBodyBytes) bytes"))
            return
        }
        var body = Array(buffer[(end + 4)...])
        while body.count < length {
            let n = read(fd, &chunk, min(chunk.count, length - body.count))
            if n <= 0 { close(fd); return }
            body.append(contentsOf: chunk[0..<n])
        }
        let pathAndQuery = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = String(pathAndQuery[0])
        var request = HTTPRequest(
            method: method, target: target, path: path, query: pathAndQuery.count > 1 ? String(pathAndQuery[1]) : nil,
            version: HTTPVersion(major: 1, minor: 1), headers: headers, body: body, pathParameters: [:],
            routePattern: nil, remoteAddress: "127.0.0.1")
        switch router.match(method: method, path: path) {
        case .notFound:
            answer(404, nil, Self.error(404, "not_found", "no route for \(path)"))
        case .methodNotAllowed(let allowed):
            var response = Self.error(405, "method_not_allowed", "\(method) is not allowed on \(path)")
            response.headers.set("Allow", allowed.joined(separator: ", "))
            answer(405, nil, response)
        case .found(let route, let params):
            request.pathParameters = params
            request.routePattern = route.pattern
            let pattern = route.pattern
            let wrapped = HTTPResponder { [self] response in
                responder.send(response)
                configuration.onResponse?(pattern, method, response.status, DispatchTime.now().uptimeNanoseconds - started)
            }
            route.handler(request, wrapped)
        }
    }

    private static func error(_ status: Int, _ code: String, _ message: String) -> HTTPResponse {
        let body = "{\"error\":{\"code\":\"\(code)\",\"message\":\"\(message)\"}}"
        return HTTPResponse(status: status, headers: HTTPHeaders([("Content-Type", "application/json")]), body: Array(body.utf8))
    }

    private func write(_ fd: Int32, _ response: HTTPResponse, isHead: Bool) {
        var head = "HTTP/1.1 \(response.status) X\r\n"
        var headers = response.headers
        if !headers.contains("Content-Length") && response.status != 204 {
            headers.set("Content-Length", String(response.body.count))
        }
        headers.set("Connection", "close")
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        head += "\r\n"
        var bytes = Array(head.utf8)
        if !isHead { bytes += response.body }
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if n <= 0 { return }
            offset += n
        }
    }

    private static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for i in 0...(haystack.count - needle.count) where haystack[i..<(i + needle.count)].elementsEqual(needle) {
            return i
        }
        return nil
    }
}

struct StubServerError: Error {
    var message: String
}
