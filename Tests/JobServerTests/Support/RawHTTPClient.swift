import Foundation
import JobCore
#if canImport(Glibc)
import Glibc
#endif

/// A response read off a socket.
struct WireResponse {
    var status: Int
    var headers: [(String, String)]
    var body: [UInt8]

    func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
    var json: JSONValue? { try? JSONValue.parse(body) }
    var text: String { String(decoding: body, as: UTF8.self) }
}

enum RawHTTPClientError: Error {
    case connect(Int32)
    case closedEarly(String)
}

/// One request per connection (`Connection: close`), blocking, with a receive timeout.
enum RawHTTPClient {
    /// A blocking TCP connection to 127.0.0.1:`port`; the caller closes it.
    static func connect(port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw RawHTTPClientError.connect(errno) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let error = errno
            close(fd)
            throw RawHTTPClientError.connect(error)
        }
        return fd
    }

    static func send(
        port: Int, _ method: String, _ target: String, headers: [(String, String)] = [], body: String? = nil,
        timeoutSeconds: Int = 10
    ) throws -> WireResponse {
        let fd = try connect(port: port)
        defer { close(fd) }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.utf8.count)\r\n" }
        head += "\r\n"
        let bytes = Array((head + (body ?? "")).utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { throw RawHTTPClientError.closedEarly("write") }
            offset += n
        }
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var parsed: (Int, [(String, String)], Int)?  // status, headers, body start
        while true {
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { break }
            received.append(contentsOf: chunk[0..<n])
            if parsed == nil { parsed = parseHead(received) }
            if let (_, hdrs, start) = parsed, let lengthText = hdrs.first(where: { $0.0.lowercased() == "content-length" })?.1,
                let length = Int(lengthText), received.count - start >= (method == "HEAD" ? 0 : length)
            {
                break
            }
        }
        if parsed == nil { parsed = parseHead(received) }
        guard let (status, hdrs, start) = parsed else {
            throw RawHTTPClientError.closedEarly(String(decoding: received, as: UTF8.self))
        }
        return WireResponse(status: status, headers: hdrs, body: Array(received[start...]))
    }

    private static func parseHead(_ bytes: [UInt8]) -> (Int, [(String, String)], Int)? {
        let marker: [UInt8] = [13, 10, 13, 10]
        guard bytes.count >= 4 else { return nil }
        var end: Int?
        for i in 0...(bytes.count - 4) where bytes[i..<(i + 4)].elementsEqual(marker) {
            end = i
            break
        }
        guard let end else { return nil }
        let lines = String(decoding: bytes[0..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let statusParts = lines[0].split(separator: " ")
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else { return nil }
        var headers: [(String, String)] = []
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        return (status, headers, end + 4)
    }
}
