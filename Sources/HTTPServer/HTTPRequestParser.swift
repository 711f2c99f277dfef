import Glibc

/// The hard limits the parser enforces.
struct HTTPParserLimits: Equatable {
    /// Request line plus header fields (and, separately, chunked trailers), in bytes.
    var maxHeaderBytes = 16 * 1024
    /// The request target, in bytes.
    var maxTargetBytes = 8 * 1024
    /// The decoded request body, in bytes.
    var maxBodyBytes = 1 << 20
}

/// Why a request was refused: the status, the error code of the JSON body and a message.
struct HTTPParseError: Error, Equatable {
    var status: Int
    var code: String
    var message: String

    static func badRequest(_ message: String) -> HTTPParseError {
        HTTPParseError(status: 400, code: "bad_request", message: message)
    }
    static func uriTooLong(_ limit: Int) -> HTTPParseError {
        HTTPParseError(status: 414, code: "uri_too_long", message: "request target longer than \(limit) bytes")
    }
    static func headersTooLarge(_ limit: Int) -> HTTPParseError {
        HTTPParseError(status: 431, code: "headers_too_large", message: "request header section larger than \(limit) bytes")
    }
    static func payloadTooLarge(_ limit: Int) -> HTTPParseError {
        HTTPParseError(status: 413, code: "payload_too_large", message: "request body larger than \(limit) bytes")
    }
    static func expectationFailed() -> HTTPParseError {
        HTTPParseError(status: 417, code: "expectation_failed", message: "the only expectation supported is 100-continue")
    }
}

/// A complete request with what the connection needs to know about it.
struct ParsedRequest {
    var request: HTTPRequest
    /// Whether the connection may stay open after the response.
    var keepAlive: Bool
}

/// What the parser saw after consuming some bytes.
enum HTTPParserEvent {
    /// The head is complete, asked for `100-continue`, and a body follows: the caller answers `100 Continue`.
    case continueExpected
    /// One complete request.
    case request(ParsedRequest)
    /// The input is not acceptable; the parser stays failed and the caller answers and closes.
    case failure(HTTPParseError)
}

/// An HTTP/1.1 request parser as a pure state machine: fed arbitrary chunks of bytes, it consumes them
/// up to the next event and reports how much it used. It never reads beyond what a request needs, so
/// the caller can keep unconsumed bytes (pipelined requests) for later.
struct HTTPRequestParser {
    private enum State {
        case requestLine
        case headerLine
        case body(remaining: Int)
        case chunkSize
        case chunkData(remaining: Int)
        case chunkDataEnd
        case trailer
        case failed
    }

    /// A chunk-size line (with extensions) longer than this is refused.
    private static let maxChunkLineBytes = 1024

    let limits: HTTPParserLimits
    private let remoteAddress: String
    private var state = State.requestLine
    private var line: [UInt8] = []
    private var headBytes = 0

    private var method = ""
    private var target = ""
    private var path = ""
    private var query: String?
    private var version = HTTPVersion.http1_1
    private var headers = HTTPHeaders()
    private var body: [UInt8] = []
    private var hostCount = 0
    private var contentLength: Int?
    private var contentLengthBad = false
    private var transferEncoding: [UInt8]?
    private var connectionClose = false
    private var connectionKeepAlive = false
    private var expectContinue = false
    /// An `Expect` field other than `100-continue` (RFC 9110 §10.1.1): answered 417 once the head is complete.
    private var expectUnsupported = false

    init(limits: HTTPParserLimits, remoteAddress: String = "") {
        self.limits = limits
        self.remoteAddress = remoteAddress
        line.reserveCapacity(256)
    }

    /// True when no byte of a next request has been seen: between requests.
    var isIdle: Bool {
        if case .requestLine = state { return line.isEmpty && headBytes == 0 }
        return false
    }

    /// True while the body of a request is being read.
    var isReadingBody: Bool {
        switch state {
        case .body, .chunkSize, .chunkData, .chunkDataEnd, .trailer: return true
        default: return false
        }
    }

    /// Consumes bytes up to the next event.
    /// - Returns: how many bytes were used and the event, if one happened; with no event, every byte was used.
    mutating func parse(_ buffer: UnsafeRawBufferPointer) -> (consumed: Int, event: HTTPParserEvent?) {
        var index = 0
        let count = buffer.count
        while index < count {
            switch state {
            case .failed:
                return (count, nil)
            case .body(let remaining):
                let take = min(remaining, count - index)
                body.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[index..<(index + take)]))
                index += take
                if take == remaining {
                    return (index, .request(finishRequest()))
                }
                state = .body(remaining: remaining - take)
            case .chunkData(let remaining):
                let take = min(remaining, count - index)
                body.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[index..<(index + take)]))
                index += take
                state = take == remaining ? .chunkDataEnd : .chunkData(remaining: remaining - take)
            case .requestLine, .headerLine, .chunkSize, .chunkDataEnd, .trailer:
                let start = index
                guard let base = buffer.baseAddress else { return (count, nil) }
                let found = memchr(base + start, 0x0A, count - start)
                let end = found.map { base.distance(to: UnsafeRawPointer($0)) } ?? count
                let lineLimit = currentLineLimit()
                if found == nil {
                    line.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[start..<end]))
                    if line.count > lineLimit {
                        return (count, fail(lineLimitError()))
                    }
                    return (count, nil)
                }
                index = end + 1
                let event: HTTPParserEvent?
                if line.isEmpty {
                    if end - start > lineLimit {
                        line.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[start..<end]))
                        return (index, fail(lineLimitError()))
                    }
                    event = completeLine(UnsafeRawBufferPointer(rebasing: buffer[start..<end]), length: end - start + 1)
                } else {
                    line.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[start..<end]))
                    if line.count > lineLimit {
                        return (index, fail(lineLimitError()))
                    }
                    let length = line.count + 1
                    event = line.withUnsafeBytes { completeLine($0, length: length) }
                    line.removeAll(keepingCapacity: true)
                }
                if let event = event {
                    return (index, event)
                }
            }
        }
        return (count, nil)
    }

    /// Convenience for tests and callers holding an array.
    mutating func parse(_ bytes: [UInt8]) -> (consumed: Int, event: HTTPParserEvent?) {
        bytes.withUnsafeBytes { parse($0) }
    }

    // MARK: - Lines

    private func currentLineLimit() -> Int {
        switch state {
        case .requestLine: return min(limits.maxTargetBytes + 64, max(0, limits.maxHeaderBytes - headBytes))
        case .headerLine: return max(0, limits.maxHeaderBytes - headBytes)
        case .trailer: return max(0, limits.maxHeaderBytes - headBytes)
        default: return HTTPRequestParser.maxChunkLineBytes
        }
    }

    private func lineLimitError() -> HTTPParseError {
        switch state {
        case .requestLine:
            let headerRoom = limits.maxHeaderBytes - headBytes
            if headerRoom < limits.maxTargetBytes + 64 && line.count > headerRoom {
                return .headersTooLarge(limits.maxHeaderBytes)
            }
            // A space means the method ended, so what overflows is the target.
            return line.contains(UInt8(ascii: " ")) ? .uriTooLong(limits.maxTargetBytes) : .badRequest("malformed request line")
        case .headerLine, .trailer:
            return .headersTooLarge(limits.maxHeaderBytes)
        default:
            return .badRequest("malformed chunk")
        }
    }

    private mutating func fail(_ error: HTTPParseError) -> HTTPParserEvent {
        state = .failed
        line = []
        return .failure(error)
    }

    /// Handles one line (without its LF; a trailing CR is dropped here). `length` counts the LF too.
    private mutating func completeLine(_ raw: UnsafeRawBufferPointer, length: Int) -> HTTPParserEvent? {
        var content = raw
        if let last = content.last, last == 0x0D {
            content = UnsafeRawBufferPointer(rebasing: content.dropLast())
        }
        switch state {
        case .requestLine:
            if content.isEmpty {
                // RFC 9112 §2.2: empty lines before a request line are ignored (bounded by the head limit).
                headBytes += length
                if headBytes > limits.maxHeaderBytes { return fail(.headersTooLarge(limits.maxHeaderBytes)) }
                return nil
            }
            headBytes += length
            if let error = parseRequestLine(content) { return fail(error) }
            state = .headerLine
            return nil
        case .headerLine:
            headBytes += length
            if headBytes > limits.maxHeaderBytes { return fail(.headersTooLarge(limits.maxHeaderBytes)) }
            if content.isEmpty {
                return finishHead()
            }
            if let error = parseHeaderLine(content, store: true) { return fail(error) }
            return nil
        case .chunkSize:
            return parseChunkSize(content)
        case .chunkDataEnd:
            if !content.isEmpty { return fail(.badRequest("chunk data not followed by CRLF")) }
            state = .chunkSize
            return nil
        case .trailer:
            headBytes += length
            if headBytes > limits.maxHeaderBytes { return fail(.headersTooLarge(limits.maxHeaderBytes)) }
            if content.isEmpty {
                return .request(finishRequest())
            }
            if let error = parseHeaderLine(content, store: false) { return fail(error) }
            return nil
        default:
            return nil
        }
    }

    private mutating func parseRequestLine(_ content: UnsafeRawBufferPointer) -> HTTPParseError? {
        guard let firstSpace = content.firstIndex(of: UInt8(ascii: " ")) else {
            return .badRequest("malformed request line")
        }
        let rest = content[(firstSpace + 1)...]
        guard let secondSpace = rest.firstIndex(of: UInt8(ascii: " ")) else {
            return .badRequest("malformed request line")
        }
        let methodBytes = content[..<firstSpace]
        let targetBytes = content[(firstSpace + 1)..<secondSpace]
        let versionBytes = content[(secondSpace + 1)...]
        guard !methodBytes.isEmpty, methodBytes.allSatisfy(isTokenByte) else {
            return .badRequest("malformed request method")
        }
        guard !targetBytes.isEmpty, targetBytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            return .badRequest("malformed request target")
        }
        if targetBytes.count > limits.maxTargetBytes {
            return .uriTooLong(limits.maxTargetBytes)
        }
        guard versionBytes.count == 8, versionBytes.starts(with: "HTTP/1.".utf8),
              let minor = versionBytes.last, minor >= UInt8(ascii: "0"), minor <= UInt8(ascii: "9") else {
            return .badRequest("unsupported or malformed HTTP version")
        }
        version = minor == UInt8(ascii: "0") ? .http1_0 : .http1_1
        method = String(decoding: UnsafeRawBufferPointer(rebasing: methodBytes), as: UTF8.self)
        target = String(decoding: UnsafeRawBufferPointer(rebasing: targetBytes), as: UTF8.self)
        guard let split = splitTarget(target) else {
            return .badRequest("malformed request target")
        }
        path = split.path
        query = split.query
        return nil
    }

    private mutating func parseHeaderLine(_ content: UnsafeRawBufferPointer, store: Bool) -> HTTPParseError? {
        guard let first = content.first else { return .badRequest("empty header line") }
        if first == UInt8(ascii: " ") || first == UInt8(ascii: "\t") {
            return .badRequest("obsolete line folding in header section")
        }
        guard let colon = content.firstIndex(of: UInt8(ascii: ":")) else {
            return .badRequest("header field without colon")
        }
        let name = UnsafeRawBufferPointer(rebasing: content[..<colon])
        guard !name.isEmpty else { return .badRequest("empty header field name") }
        for byte in name where !isTokenByte(byte) {
            if byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") {
                return .badRequest("whitespace between header field name and colon")
            }
            return .badRequest("invalid character in header field name")
        }
        var valueStart = colon + 1
        var valueEnd = content.count
        while valueStart < valueEnd, content[valueStart] == 0x20 || content[valueStart] == 0x09 { valueStart += 1 }
        while valueEnd > valueStart, content[valueEnd - 1] == 0x20 || content[valueEnd - 1] == 0x09 { valueEnd -= 1 }
        let value = UnsafeRawBufferPointer(rebasing: content[valueStart..<valueEnd])
        for byte in value where (byte < 0x20 && byte != 0x09) || byte == 0x7F {
            return .badRequest("invalid character in header field value")
        }
        guard store else { return nil }
        if let error = noteSpecialHeader(name: name, value: value) { return error }
        headers.add(String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self))
        return nil
    }

    /// Picks out the fields that decide framing and connection handling, before any String is made.
    private mutating func noteSpecialHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> HTTPParseError? {
        switch name.count {
        case 4 where bytesEqualFolded(name, "host"):
            hostCount += 1
            if !isValidHost(value) { return .badRequest("invalid Host header") }
        case 14 where bytesEqualFolded(name, "content-length"):
            // A list of identical values ("5, 5") or repeated identical fields are allowed (RFC 9110 §8.6).
            for part in value.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false) {
                var digits = part[...]
                while let f = digits.first, f == 0x20 || f == 0x09 { digits = digits.dropFirst() }
                while let l = digits.last, l == 0x20 || l == 0x09 { digits = digits.dropLast() }
                guard !digits.isEmpty, digits.count <= 18, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else {
                    return .badRequest("invalid Content-Length")
                }
                let n = digits.reduce(0) { $0 * 10 + Int($1 - 0x30) }
                if let existing = contentLength, existing != n {
                    return .badRequest("conflicting Content-Length values")
                }
                contentLength = n
            }
        case 17 where bytesEqualFolded(name, "transfer-encoding"):
            if transferEncoding == nil {
                transferEncoding = Array(value)
            } else {
                transferEncoding?.append(contentsOf: Array(", ".utf8))
                transferEncoding?.append(contentsOf: value)
            }
        case 10 where bytesEqualFolded(name, "connection"):
            for token in value.split(separator: UInt8(ascii: ",")) {
                let trimmed = trimOWS(token)
                if bytesEqualFolded(trimmed, "close") { connectionClose = true }
                if bytesEqualFolded(trimmed, "keep-alive") { connectionKeepAlive = true }
            }
        case 6 where bytesEqualFolded(name, "expect"):
            if bytesEqualFolded(value[...], "100-continue") {
                expectContinue = true
            } else {
                expectUnsupported = true
            }
        default:
            break
        }
        return nil
    }

    private mutating func finishHead() -> HTTPParserEvent? {
        if hostCount > 1 { return fail(.badRequest("more than one Host header")) }
        if hostCount == 0 && version == .http1_1 { return fail(.badRequest("missing Host header")) }
        var chunked = false
        if let te = transferEncoding {
            if contentLength != nil { return fail(.badRequest("both Content-Length and Transfer-Encoding")) }
            if version == .http1_0 { return fail(.badRequest("Transfer-Encoding in an HTTP/1.0 request")) }
            guard bytesEqualFolded(trimOWS(te[...]), "chunked") else {
                return fail(.badRequest("unsupported Transfer-Encoding"))
            }
            chunked = true
        }
        if let length = contentLength, length > limits.maxBodyBytes {
            return fail(.payloadTooLarge(limits.maxBodyBytes))
        }
        if expectUnsupported { return fail(.expectationFailed()) }
        let hasBody = chunked || (contentLength ?? 0) > 0
        if !hasBody {
            return .request(finishRequest())
        }
        if chunked {
            state = .chunkSize
        } else {
            let length = contentLength ?? 0
            body.reserveCapacity(length)
            state = .body(remaining: length)
        }
        if expectContinue && version == .http1_1 {
            return .continueExpected
        }
        return nil
    }

    private mutating func parseChunkSize(_ content: UnsafeRawBufferPointer) -> HTTPParserEvent? {
        var size = 0
        var i = 0
        while i < content.count, let digit = hexValue(content[i]) {
            if i >= 15 { return fail(.badRequest("chunk size too long")) }
            size = size << 4 | Int(digit)
            i += 1
        }
        if i == 0 { return fail(.badRequest("malformed chunk size")) }
        while i < content.count, content[i] == 0x20 || content[i] == 0x09 { i += 1 }
        if i < content.count && content[i] != UInt8(ascii: ";") {
            return fail(.badRequest("malformed chunk size"))
        }
        if size == 0 {
            state = .trailer
            return nil
        }
        if body.count + size > limits.maxBodyBytes {
            return fail(.payloadTooLarge(limits.maxBodyBytes))
        }
        state = .chunkData(remaining: size)
        return nil
    }

    private mutating func finishRequest() -> ParsedRequest {
        let keepAlive: Bool
        switch version {
        case .http1_1: keepAlive = !connectionClose
        case .http1_0: keepAlive = connectionKeepAlive && !connectionClose
        }
        let request = HTTPRequest(method: method, target: target, path: path, query: query, version: version,
                                  headers: headers, body: body, remoteAddress: remoteAddress)
        state = .requestLine
        headBytes = 0
        headers = HTTPHeaders()
        body = []
        hostCount = 0
        contentLength = nil
        transferEncoding = nil
        connectionClose = false
        connectionKeepAlive = false
        expectContinue = false
        expectUnsupported = false
        return ParsedRequest(request: request, keepAlive: keepAlive)
    }
}

@inline(__always)
private func isTokenByte(_ b: UInt8) -> Bool {
    switch b {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
        return true
    case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
         UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
         UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
        return true
    default:
        return false
    }
}

private func trimOWS<C: BidirectionalCollection>(_ bytes: C) -> C.SubSequence where C.Element == UInt8 {
    var s = bytes[...]
    while let f = s.first, f == 0x20 || f == 0x09 { s = s.dropFirst() }
    while let l = s.last, l == 0x20 || l == 0x09 { s = s.dropLast() }
    return s
}

/// Compares bytes with a lowercase ASCII literal, folding the bytes' case.
private func bytesEqualFolded<C: Collection>(_ bytes: C, _ lower: StaticString) -> Bool where C.Element == UInt8 {
    guard bytes.count == lower.utf8CodeUnitCount else { return false }
    let literal = UnsafeBufferPointer(start: lower.utf8Start, count: lower.utf8CodeUnitCount)
    var i = 0
    for b in bytes {
        let folded = (b >= 0x41 && b <= 0x5A) ? b | 0x20 : b
        if folded != literal[i] { return false }
        i += 1
    }
    return true
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a bracketed IP literal or a reg-name of unreserved,
/// percent-encoded and sub-delim characters, then an optional port of at most 65535. An empty value is allowed.
func isValidHost(_ value: UnsafeRawBufferPointer) -> Bool {
    var i = 0
    let n = value.count
    if n == 0 { return true }
    if value[0] == UInt8(ascii: "[") {
        i = 1
        while i < n, value[i] != UInt8(ascii: "]") {
            let c = value[i]
            let allowed = (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
                || c == UInt8(ascii: ":") || c == UInt8(ascii: ".") || c == UInt8(ascii: "v") || c == UInt8(ascii: "V")
            if !allowed { return false }
            i += 1
        }
        guard i < n, i > 1 else { return false }
        i += 1
    } else {
        while i < n, value[i] != UInt8(ascii: ":") {
            let c = value[i]
            if c == UInt8(ascii: "%") {
                guard i + 2 < n, isHexDigit(value[i + 1]), isHexDigit(value[i + 2]) else { return false }
                i += 3
                continue
            }
            let unreserved = (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
                || c == UInt8(ascii: "-") || c == UInt8(ascii: ".") || c == UInt8(ascii: "_") || c == UInt8(ascii: "~")
            let subDelim = Array("!$&'()*+,;=".utf8).contains(c)
            if !unreserved && !subDelim { return false }
            i += 1
        }
    }
    if i == n { return true }
    guard value[i] == UInt8(ascii: ":") else { return false }
    let digits = n - i - 1
    guard digits <= 5 else { return false }
    var port = 0
    for c in value[(i + 1)...] {
        guard c >= 0x30 && c <= 0x39 else { return false }
        port = port * 10 + Int(c - 0x30)
    }
    return port <= 65535
}

private func isHexDigit(_ c: UInt8) -> Bool {
    (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
}
