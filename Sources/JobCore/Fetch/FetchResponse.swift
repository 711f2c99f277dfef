import CCurl

/// A complete HTTP response, with its body read as the request's `expect` asked.
public struct FetchResponse: Sendable {
    /// The final response's status code.
    public var status: Int
    /// The final response's header fields (after redirects): names lowercased,
    /// repeated fields joined with `", "`, in first-seen order.
    public var headers: [(name: String, value: String)]
    /// The body: the parsed value for `json`, a string for `text` and `base64`.
    public var body: JSONValue
    /// `"json"`, `"text"` or `"base64"`.
    public var bodyEncoding: String
    /// The body's bytes as received.
    public var rawBody: [UInt8]
    /// The `content-type` header, if any.
    public var contentType: String?
    /// The body's length in bytes.
    public var bytes: Int
    /// Milliseconds from `Fetcher.start` to the end of the transfer, retries and backoffs included.
    public var elapsedMs: Int
    /// The final URL, after redirects.
    public var url: String
    /// The protocol the final response came over: `"1.0"`, `"1.1"`, `"2"` or `"3"`; `nil` when unknown.
    public var httpVersion: String?
    /// For a fetch with `coalesce`: whether it shared a transfer another fetch started (API.md §9).
    public var coalesced: Bool?
    /// For a fetch with `cache: "use"`: `hit`, `revalidated` or `miss` (API.md §9).
    public var cacheOutcome: String?

    /// Creates a response value.
    public init(
        status: Int, headers: [(name: String, value: String)], body: JSONValue, bodyEncoding: String,
        rawBody: [UInt8], contentType: String?, bytes: Int, elapsedMs: Int, url: String
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.bodyEncoding = bodyEncoding
        self.rawBody = rawBody
        self.contentType = contentType
        self.bytes = bytes
        self.elapsedMs = elapsedMs
        self.url = url
    }

    /// The value of header `name` (any case), if present.
    public func header(_ name: String) -> String? {
        let key = name.lowercased()
        return headers.first(where: { $0.name == key })?.value
    }

    /// The fetch node's result object of API.md §1.2:
    /// `{"status","headers","body","body_encoding","bytes","elapsed_ms","url"}` in that order.
    public var json: JSONValue { json(headers: HeaderObjects.object(headers)) }

    /// `json` with `headers` as its `headers` member: the object of `headers` as `HeaderObjects` shares it.
    public func json(headers: JSONValue) -> JSONValue {
        // Made to its size: a job holds one per fetch while it runs (`+` left each about twice as large, and room
        // for all ten members a third larger than the usual seven).
        var members: [JSONMember] = []
        members.reserveCapacity(7 + (httpVersion == nil ? 0 : 1) + (coalesced == nil ? 0 : 1) + (cacheOutcome == nil ? 0 : 1))
        members.append(JSONMember("status", .int(status)))
        members.append(JSONMember("headers", headers))
        members.append(JSONMember("body", body))
        members.append(JSONMember("body_encoding", .string(bodyEncoding)))
        members.append(JSONMember("bytes", .int(bytes)))
        members.append(JSONMember("elapsed_ms", .int(elapsedMs)))
        members.append(JSONMember("url", .string(url)))
        if let httpVersion { members.append(JSONMember("http_version", .string(httpVersion))) }
        if let coalesced { members.append(JSONMember("coalesced", .bool(coalesced))) }
        if let cacheOutcome { members.append(JSONMember("cache", .string(cacheOutcome))) }
        return .object(members)
    }

    /// The words for libcurl's `CURLINFO_HTTP_VERSION`.
    static func httpVersion(curlCode: Int) -> String? {
        switch curlCode {
        case Int(CURL_HTTP_VERSION_1_0): return "1.0"
        case Int(CURL_HTTP_VERSION_1_1): return "1.1"
        case Int(CURL_HTTP_VERSION_2_0): return "2"
        case Int(CURL_HTTP_VERSION_3): return "3"
        default: return nil
        }
    }
}

/// The `headers` objects of fetch results, each shared with the result before it where they agree: a job of 100,000
/// fetches from one server holds 100,000 results whose headers differ, if at all, in their `date`, and each object
/// was 550 bytes of members and strings (55 MB in all). The same header fields as the last result's are its object
/// again; otherwise each value the last result had at the same place is its string again. Used on one thread (the
/// engine's queue).
public final class HeaderObjects {
    private var last: [JSONMember] = []
    private var lastObject: JSONValue = .object([])

    public init() {}

    /// The `headers` object of `fields`.
    public func object(_ fields: [(name: String, value: String)]) -> JSONValue {
        // The same fields: the last object, with no members built (the usual case, once per fetch).
        if fields.count == last.count, fields.indices.allSatisfy({ repeats(fields[$0], at: $0) }) { return lastObject }
        last = fields.indices.map { k in
            repeats(fields[k], at: k) ? last[k] : JSONMember(fields[k].name, .string(fields[k].value))
        }
        lastObject = .object(last)
        return lastObject
    }

    /// Whether `field` is the last object's member at `k`.
    private func repeats(_ field: (name: String, value: String), at k: Int) -> Bool {
        guard k < last.count, last[k].key == field.name, case .string(let value) = last[k].value else { return false }
        return value == field.value
    }

    /// The `headers` object of `fields`, shared with no other.
    public static func object(_ fields: [(name: String, value: String)]) -> JSONValue {
        .object(fields.map { JSONMember($0.name, .string($0.value)) })
    }
}

/// How one `Fetcher.start` ended.
public struct FetchOutcome: Sendable {
    /// The response, or the error (its `node` left `nil` for the engine to fill).
    public var result: Result<FetchResponse, NodeError>
    /// The number of attempts started (1 when no retry happened; 0 if cancelled before the first).
    public var attempts: Int
    /// The last complete response, also on an `http_status` failure so its body can be kept.
    public var lastResponse: FetchResponse?
    /// The `too_large` failure is a job's or the server's byte budget crossed (`--max-job-bytes`,
    /// `--max-response-memory`), not the fetch's own `max_bytes`.
    public var crossedBudget: Bool

    /// Creates an outcome value.
    public init(
        result: Result<FetchResponse, NodeError>, attempts: Int, lastResponse: FetchResponse?, crossedBudget: Bool = false
    ) {
        self.result = result
        self.attempts = attempts
        self.lastResponse = lastResponse
        self.crossedBudget = crossedBudget
    }
}

/// A snapshot of a `Fetcher`'s counters, for metrics.
public struct FetcherStats: Sendable, Equatable {
    /// The upper bounds (ms, inclusive) of the latency histogram's buckets; a last, unbounded bucket follows.
    public static let latencyBoundsMs = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]

    /// Completed fetches by outcome: `"succeeded"` or an `ErrorKind` raw value.
    public var outcomes: [String: Int] = [:]
    /// Completed fetches per latency bucket: `latencyBoundsMs.count + 1` entries, not cumulative.
    public var latencyCounts = [Int](repeating: 0, count: FetcherStats.latencyBoundsMs.count + 1)
    /// The sum of all completed fetches' `elapsedMs`.
    public var latencySumMs = 0
    /// Attempts started, first attempts and retries together.
    public var attempts = 0
    /// Transfers started and not yet completed.
    public var inFlight = 0
    /// Transfers waiting out the backoff before a retry.
    public var backingOff = 0

    /// An empty snapshot.
    public init() {}

    /// The number of completed fetches.
    public var completed: Int { latencyCounts.reduce(0, +) }

    mutating func record(outcome: String, elapsedMs: Int) {
        outcomes[outcome, default: 0] += 1
        let index = FetcherStats.latencyBoundsMs.firstIndex(where: { elapsedMs <= $0 }) ?? FetcherStats.latencyBoundsMs.count
        latencyCounts[index] += 1
        latencySumMs += elapsedMs
    }
}

/// Reading a body as `expect` asks (API.md §1.2).
enum BodyDecoder {
    enum Decoded {
        case value((JSONValue, String))
        case invalidJSON(String)
    }

    /// The decoded body and its encoding, or an `invalid_json` message.
    ///
    /// - `json`: the body must parse, else `invalid_json`.
    /// - `text`: a string when the bytes are valid UTF-8; otherwise base64 (the
    ///   encoding says so) rather than a failure, so no byte is lost.
    /// - `bytes`: always base64.
    /// - `auto`: JSON when the content type says JSON (`application/json`,
    ///   `*+json`), and then a body that does not parse is `invalid_json`; text
    ///   when the type is textual (or absent) and the bytes are UTF-8; base64
    ///   otherwise.
    /// - Parameter strict: false for the body of a response that failed anyway
    ///   (`http_status`): it is kept however it reads, never `invalid_json`.
    static func decode(_ raw: [UInt8], contentType: String?, expect: FetchExpect, strict: Bool = true) -> Decoded {
        switch expect {
        case .json:
            do {
                return .value((try JSONValue.parse(raw), "json"))
            } catch {
                return .invalidJSON("response body is not valid JSON: \(error)")
            }
        case .text:
            if let text = String(validating: raw, as: UTF8.self) { return .value((.string(text), "text")) }
            return .value((.string(Base64.encode(raw)), "base64"))
        case .bytes:
            return .value((.string(Base64.encode(raw)), "base64"))
        case .auto:
            let type = mediaType(contentType)
            // An empty body (HEAD, 204) is an empty text under any label.
            if isJSON(type), !raw.isEmpty {
                do {
                    return .value((try JSONValue.parse(raw), "json"))
                } catch {
                    if strict { return .invalidJSON("response labelled \(type) is not valid JSON: \(error)") }
                }
            }
            if type.isEmpty || isTextual(type) || isJSON(type), let text = String(validating: raw, as: UTF8.self) {
                return .value((.string(text), "text"))
            }
            return .value((.string(Base64.encode(raw)), "base64"))
        }
    }

    /// `type/subtype` lowercased, without parameters.
    static func mediaType(_ contentType: String?) -> String {
        guard let contentType else { return "" }
        // On bytes: media types are ASCII, and this runs once per response.
        var bytes: [UInt8] = []
        bytes.reserveCapacity(contentType.utf8.count)
        for byte in contentType.utf8 {
            if byte == 59 { break }  // ";"
            bytes.append(byte >= 65 && byte <= 90 ? byte + 32 : byte)
        }
        func isSpace(_ byte: UInt8) -> Bool { byte == 32 || byte == 9 || byte == 13 || byte == 10 }
        var start = 0
        var end = bytes.count
        while start < end, isSpace(bytes[start]) { start += 1 }
        while end > start, isSpace(bytes[end - 1]) { end -= 1 }
        return String(decoding: bytes[start..<end], as: UTF8.self)
    }

    static func isJSON(_ type: String) -> Bool {
        type == "application/json" || type.hasSuffix("+json")
    }

    static func isTextual(_ type: String) -> Bool {
        type.hasPrefix("text/") || type.hasSuffix("+xml") || type == "application/xml"
            || type == "application/javascript" || type == "application/x-www-form-urlencoded"
            || type == "application/x-ndjson"
    }
}

extension Substring {
    func trimmingSpaces() -> String {
        var slice = self[...]
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" || last == "\r" || last == "\n" { slice = slice.dropLast() }
        return String(slice)
    }
}

/// Standard base64 (RFC 4648 §4) with padding.
enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ bytes: [UInt8]) -> String {
        let count = (bytes.count + 2) / 3 * 4
        // Written straight into the string's storage: a 10 MB body's 13 MB of text exists once, not also as an
        // array the string would be copied from.
        return String(unsafeUninitializedCapacity: count) { out in
            bytes.withUnsafeBufferPointer { input in
                var index = 0
                var o = 0
                while index + 3 <= input.count {
                    let n = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8 | UInt32(input[index + 2])
                    out[o] = alphabet[Int(n >> 18 & 63)]
                    out[o + 1] = alphabet[Int(n >> 12 & 63)]
                    out[o + 2] = alphabet[Int(n >> 6 & 63)]
                    out[o + 3] = alphabet[Int(n & 63)]
                    index += 3
                    o += 4
                }
                let rest = input.count - index
                if rest > 0 {
                    var n = UInt32(input[index]) << 16
                    if rest == 2 { n |= UInt32(input[index + 1]) << 8 }
                    out[o] = alphabet[Int(n >> 18 & 63)]
                    out[o + 1] = alphabet[Int(n >> 12 & 63)]
                    out[o + 2] = rest == 2 ? alphabet[Int(n >> 6 & 63)] : UInt8(ascii: "=")
                    out[o + 3] = UInt8(ascii: "=")
                    o += 4
                }
                return o
            }
        }
    }
}
