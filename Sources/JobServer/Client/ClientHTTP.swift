import CCurl
import Foundation

/// One answer the server gave the command-line client.
struct ClientResponse {
    var status: Int
    var body: [UInt8]
    var text: String { String(decoding: body, as: UTF8.self) }
}

/// Why a client command stops: its exit status and a one-line reason for stderr.
struct ClientFailure: Error, CustomStringConvertible {
    var exitStatus: Int32
    var message: String
    var description: String { message }

    static func usage(_ message: String) -> ClientFailure { ClientFailure(exitStatus: 2, message: message) }
}

/// Blocking HTTP requests to one jobserver through libcurl: the CLI does one thing at a time, so an easy handle
/// per request is all it needs.
struct ClientHTTP {
    var baseURL: String
    var token: String?

    /// `curl_global_init` once per process, before the first handle.
    private static let global: CURLcode = curl_global_init(Int(CURL_GLOBAL_ALL))

    /// Sends `method path` with an optional JSON body and waits at most `timeoutSeconds` for the whole answer.
    /// - Throws: `ClientFailure` (exit 2) when no HTTP answer came.
    func send(_ method: String, _ path: String, json body: [UInt8]? = nil, timeoutSeconds: Int = 30) throws -> ClientResponse {
        guard Self.global == CURLE_OK, let easy = curl_easy_init() else {
            throw ClientFailure(exitStatus: 2, message: "cannot start libcurl")
        }
        defer { curl_easy_cleanup(easy) }
        let sink = BodySink()
        let sinkPointer = Unmanaged.passUnretained(sink).toOpaque()
        var errorBuffer = [CChar](repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        var headers: UnsafeMutablePointer<curl_slist>?
        defer { curl_slist_free_all(headers) }
        if let token { headers = curl_slist_append(headers, "Authorization: Bearer \(token)") }
        if body != nil {
            headers = curl_slist_append(headers, "Content-Type: application/json")
            headers = curl_slist_append(headers, "Expect:")
        }
        let url = baseURL + path
        let code: CURLcode = errorBuffer.withUnsafeMutableBufferPointer { buffer in
            var ok = true
            func check(_ code: CURLcode) { if code != CURLE_OK { ok = false } }
            check(ccurl_easy_setopt_str(easy, CURLOPT_URL, url))
            check(ccurl_easy_setopt_ptr(easy, CURLOPT_ERRORBUFFER, buffer.baseAddress))
            check(ccurl_easy_setopt_write_function(easy, CURLOPT_WRITEFUNCTION, clientWriteCallback))
            check(ccurl_easy_setopt_ptr(easy, CURLOPT_WRITEDATA, sinkPointer))
            check(ccurl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
            check(ccurl_easy_setopt_long(easy, CURLOPT_TIMEOUT, timeoutSeconds))
            check(ccurl_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT, 10))
            check(ccurl_easy_setopt_str(easy, CURLOPT_PROTOCOLS_STR, "http,https"))
            if let headers { check(ccurl_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, headers)) }
            if let body {
                check(ccurl_easy_setopt_int64(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)))
                body.withUnsafeBytes { raw in
                    // COPYPOSTFIELDS copies the bytes, so the array need not outlive this call.
                    let pointer = raw.baseAddress.map { UnsafeMutableRawPointer(mutating: $0) }
                    check(ccurl_easy_setopt_ptr(easy, CURLOPT_COPYPOSTFIELDS, body.isEmpty ? nil : pointer))
                }
                if method != "POST" { check(ccurl_easy_setopt_str(easy, CURLOPT_CUSTOMREQUEST, method)) }
            } else if method == "POST" {
                check(ccurl_easy_setopt_int64(easy, CURLOPT_POSTFIELDSIZE_LARGE, 0))
                check(ccurl_easy_setopt_str(easy, CURLOPT_COPYPOSTFIELDS, ""))
            } else if method != "GET" {
                check(ccurl_easy_setopt_str(easy, CURLOPT_CUSTOMREQUEST, method))
            }
            guard ok else { return CURLE_FAILED_INIT }
            return curl_easy_perform(easy)
        }
        guard code == CURLE_OK else {
            let detail = errorBuffer[0] != 0
                ? String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                : String(cString: curl_easy_strerror(code))
            throw ClientFailure(exitStatus: 2, message: "\(method) \(url): \(detail)")
        }
        var status = 0
        ccurl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        return ClientResponse(status: status, body: sink.bytes)
    }
}

/// Collects a response body; touched only by the thread running `curl_easy_perform`.
private final class BodySink {
    var bytes: [UInt8] = []
}

private let clientWriteCallback: curl_write_callback = { data, size, count, user in
    guard let user else { return 0 }
    let sink = Unmanaged<BodySink>.fromOpaque(user).takeUnretainedValue()
    let length = size * count
    guard let data, length > 0 else { return length }
    sink.bytes.append(contentsOf: UnsafeRawBufferPointer(start: UnsafeRawPointer(data), count: length))
    return length
}
