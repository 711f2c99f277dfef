/// Serialises a response head and body into `out`: status line, `Server`, `Date`, the handler's
/// headers (minus the framing ones the server owns), `Content-Length`, `Connection`, body.
///
/// With `streamed`, only the head is written, for a body sent later (`HTTPStream`); with `omitBody`, only the
/// head too, for a body the caller queues itself (`OutputQueue`). A `bodyFile` is never written here: the caller
/// queues it.
func serializeResponse(_ response: HTTPResponse, into out: inout [UInt8], dateHeader: [UInt8], isHead: Bool,
                       keepAlive: Bool, http10: Bool, streamed: StreamFraming? = nil, omitBody: Bool = false) {
    let status = response.status
    let bodyAllowed = !(status < 200 || status == 204 || status == 304)
    out.append(contentsOf: statusLine(status))
    out.append(contentsOf: serverHeader)
    out.append(contentsOf: dateHeader)
    var explicitLength: String?
    for (name, value) in response.headers {
        switch name.utf8.count {
        case 4 where asciiCaseInsensitiveEquals(name, "Date"):
            continue
        case 6 where asciiCaseInsensitiveEquals(name, "Server"):
            continue
        case 10 where asciiCaseInsensitiveEquals(name, "Connection"):
            continue
        case 14 where asciiCaseInsensitiveEquals(name, "Content-Length"):
            explicitLength = value
            continue
        case 17 where asciiCaseInsensitiveEquals(name, "Transfer-Encoding"):
            continue
        default:
            break
        }
        out.append(contentsOf: name.utf8)
        out.append(colonSpace.0)
        out.append(colonSpace.1)
        appendSanitizedValue(value, to: &out)
        out.append(0x0D)
        out.append(0x0A)
    }
    if let streamed {
        if streamed == .chunked && bodyAllowed { out.append(contentsOf: transferEncodingChunked) }
    } else if bodyAllowed {
        out.append(contentsOf: contentLengthPrefix)
        if isHead && response.bodyCount == 0, let explicit = explicitLength,
           !explicit.isEmpty, explicit.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            // A HEAD-specific handler may announce the length of the body GET would send.
            out.append(contentsOf: explicit.utf8)
        } else {
            appendDecimal(response.bodyCount, to: &out)
        }
        out.append(0x0D)
        out.append(0x0A)
    }
    if !keepAlive {
        out.append(contentsOf: connectionClose)
    } else if http10 {
        out.append(contentsOf: connectionKeepAlive)
    }
    out.append(0x0D)
    out.append(0x0A)
    if bodyAllowed && !isHead && streamed == nil && !omitBody && response.bodyFile == nil {
        out.append(contentsOf: response.body)
        for piece in response.bodyPieces { out.append(contentsOf: piece) }
    }
}

/// How a streamed body is delimited.
enum StreamFraming: Equatable {
    /// `Transfer-Encoding: chunked` (HTTP/1.1).
    case chunked
    /// No framing header: the body ends when the connection closes (HTTP/1.0, which has no chunked coding).
    case untilClose
}

private let transferEncodingChunked: [UInt8] = Array("Transfer-Encoding: chunked\r\n".utf8)

private let colonSpace: (UInt8, UInt8) = (UInt8(ascii: ":"), UInt8(ascii: " "))
private let serverHeader: [UInt8] = Array("Server: jobserver\r\n".utf8)
private let contentLengthPrefix: [UInt8] = Array("Content-Length: ".utf8)
private let connectionClose: [UInt8] = Array("Connection: close\r\n".utf8)
private let connectionKeepAlive: [UInt8] = Array("Connection: keep-alive\r\n".utf8)

/// Header values must not smuggle line breaks into the response: CR and LF become spaces.
@inline(__always)
private func appendSanitizedValue(_ value: String, to out: inout [UInt8]) {
    for byte in value.utf8 {
        out.append(byte == 0x0D || byte == 0x0A || byte == 0 ? 0x20 : byte)
    }
}

@inline(__always)
func appendDecimal(_ value: Int, to out: inout [UInt8]) {
    if value == 0 {
        out.append(UInt8(ascii: "0"))
        return
    }
    var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                 UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    var n = value.magnitude
    var count = 0
    withUnsafeMutableBytes(of: &digits) { buffer in
        while n > 0 {
            buffer[19 - count] = UInt8(ascii: "0") + UInt8(n % 10)
            n /= 10
            count += 1
        }
        if value < 0 { out.append(UInt8(ascii: "-")) }
        out.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[(20 - count)...]))
    }
}

/// Cached status lines for the codes in use; others are built on demand.
private let commonStatusLines: [Int: [UInt8]] = {
    var lines: [Int: [UInt8]] = [:]
    for code in [100, 102, 200, 201, 202, 204, 301, 302, 304, 400, 401, 403, 404, 405, 408, 409, 413, 414, 415, 417, 422,
                 429, 431,
                 500, 503] {
        lines[code] = Array("HTTP/1.1 \(code) \(reasonPhrase(code))\r\n".utf8)
    }
    return lines
}()

private let okStatusLine: [UInt8] = Array("HTTP/1.1 200 OK\r\n".utf8)

@inline(__always)
private func statusLine(_ status: Int) -> [UInt8] {
    if status == 200 { return okStatusLine }
    if let line = commonStatusLines[status] { return line }
    let code = (100...999).contains(status) ? status : 500
    return Array("HTTP/1.1 \(code) \(reasonPhrase(code))\r\n".utf8)
}

/// The reason phrase of RFC 9110 for `status`, or a generic one.
func reasonPhrase(_ status: Int) -> String {
    switch status {
    case 100: return "Continue"
    case 101: return "Switching Protocols"
    case 102: return "Processing"
    case 200: return "OK"
    case 201: return "Created"
    case 202: return "Accepted"
    case 203: return "Non-Authoritative Information"
    case 204: return "No Content"
    case 206: return "Partial Content"
    case 301: return "Moved Permanently"
    case 302: return "Found"
    case 303: return "See Other"
    case 304: return "Not Modified"
    case 307: return "Temporary Redirect"
    case 308: return "Permanent Redirect"
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 406: return "Not Acceptable"
    case 408: return "Request Timeout"
    case 409: return "Conflict"
    case 410: return "Gone"
    case 411: return "Length Required"
    case 412: return "Precondition Failed"
    case 413: return "Content Too Large"
    case 414: return "URI Too Long"
    case 415: return "Unsupported Media Type"
    case 416: return "Range Not Satisfiable"
    case 417: return "Expectation Failed"
    case 422: return "Unprocessable Content"
    case 425: return "Too Early"
    case 426: return "Upgrade Required"
    case 428: return "Precondition Required"
    case 429: return "Too Many Requests"
    case 431: return "Request Header Fields Too Large"
    case 500: return "Internal Server Error"
    case 501: return "Not Implemented"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    case 505: return "HTTP Version Not Supported"
    default:
        switch status / 100 {
        case 1: return "Informational"
        case 2: return "Success"
        case 3: return "Redirection"
        case 4: return "Client Error"
        default: return "Server Error"
        }
    }
}
