import Foundation

/// The rules of RFC 9111 a private cache follows, as pure functions of header fields and times (ms since the
/// epoch), so they are tested without a clock.
enum HTTPCachePolicy {
    /// The directives of one `Cache-Control` field value: lowercased names, values without quotes.
    static func directives(_ value: String?) -> [String: String] {
        guard let value else { return [:] }
        var out: [String: String] = [:]
        for part in value.split(separator: ",") {
            let pieces = part.split(separator: "=", maxSplits: 1)
            guard let first = pieces.first else { continue }
            let name = first.trimmingCharacters(in: .whitespaces).lowercased()
            guard !name.isEmpty else { continue }
            var argument = pieces.count > 1 ? pieces[1].trimmingCharacters(in: .whitespaces) : ""
            if argument.hasPrefix("\""), argument.hasSuffix("\""), argument.count >= 2 {
                argument = String(argument.dropFirst().dropLast())
            }
            out[name] = argument
        }
        return out
    }

    /// Status codes a response may be stored with (RFC 9110 §15.1, heuristically cacheable ones).
    static let storableStatuses: Set<Int> = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501]

    /// Why a response to a GET may not be stored, or `nil` when it may (RFC 9111 §3): not for `no-store` (in the
    /// request or the response), `Vary: *`, a status not cacheable by default, or a response that can never be
    /// reused (no explicit freshness and no validator; this cache makes no heuristic freshness).
    static func refusal(status: Int, requestHeaders: [(name: String, value: String)],
                        responseHeaders: [(name: String, value: String)]) -> String? {
        let request = directives(field("cache-control", requestHeaders))
        let response = directives(field("cache-control", responseHeaders))
        if request["no-store"] != nil || response["no-store"] != nil { return "no-store" }
        guard storableStatuses.contains(status) else { return "status \(status)" }
        if let vary = field("vary", responseHeaders), vary.split(separator: ",").contains(where: { $0.trimmingCharacters(in: .whitespaces) == "*" }) {
            return "Vary: *"
        }
        let explicit = response["max-age"] != nil || field("expires", responseHeaders) != nil
        let validator = field("etag", responseHeaders) != nil || field("last-modified", responseHeaders) != nil
        return explicit || validator ? nil : "neither freshness nor a validator"
    }

    /// Whether a stored response is fresh at `nowMs` (RFC 9111 §4.2), and so may be used without a request.
    /// - Parameters:
    ///   - requestTimeMs: when the request that brought it was sent; `responseTimeMs`: when it arrived (or was last
    ///     revalidated).
    static func isFresh(responseHeaders: [(name: String, value: String)], requestHeaders: [(name: String, value: String)],
                        requestTimeMs: Int64, responseTimeMs: Int64, nowMs: Int64) -> Bool {
        let response = directives(field("cache-control", responseHeaders))
        let request = directives(field("cache-control", requestHeaders))
        // no-cache: stored, but never used without revalidating.
        if response["no-cache"] != nil || request["no-cache"] != nil { return false }
        if field("pragma", requestHeaders)?.lowercased().contains("no-cache") == true, request.isEmpty { return false }
        let dateMs = field("date", responseHeaders).flatMap(httpDateMs)
        let lifetimeMs: Int64
        if let maxAge = response["max-age"].flatMap({ Int64($0) }) {
            lifetimeMs = max(0, maxAge) * 1000
        } else if let expiresText = field("expires", responseHeaders) {
            // An invalid Expires (such as "0") means already expired.
            guard let expires = httpDateMs(expiresText) else { return false }
            lifetimeMs = expires - (dateMs ?? responseTimeMs)
        } else {
            return false
        }
        let ageValueMs = (field("age", responseHeaders).flatMap { Int64($0.trimmingCharacters(in: .whitespaces)) } ?? 0) * 1000
        let apparentAge = max(0, responseTimeMs - (dateMs ?? responseTimeMs))
        let responseDelay = max(0, responseTimeMs - requestTimeMs)
        let correctedInitialAge = max(apparentAge, ageValueMs + responseDelay)
        var currentAge = correctedInitialAge + max(0, nowMs - responseTimeMs)
        if let requestMaxAge = request["max-age"].flatMap({ Int64($0) }), currentAge >= requestMaxAge * 1000 {
            currentAge = Int64.max / 2
        }
        return lifetimeMs > currentAge
    }

    /// The conditional header fields that revalidate a stored response: `If-None-Match` from its `ETag`,
    /// `If-Modified-Since` from its `Last-Modified`; empty when it has neither.
    static func validators(_ responseHeaders: [(name: String, value: String)]) -> [(name: String, value: String)] {
        var out: [(name: String, value: String)] = []
        if let etag = field("etag", responseHeaders) { out.append(("If-None-Match", etag)) }
        if let modified = field("last-modified", responseHeaders) { out.append(("If-Modified-Since", modified)) }
        return out
    }

    /// The stored header fields updated by a `304` (RFC 9111 §3.2): each field the 304 carries replaces the
    /// stored one, except those that describe the stored body.
    static func updated(_ stored: [(name: String, value: String)], with fresh: [(name: String, value: String)])
        -> [(name: String, value: String)]
    {
        let kept: Set<String> = ["content-length", "content-encoding", "transfer-encoding", "content-type", "content-range"]
        var out = stored
        for field in fresh where !kept.contains(field.name) {
            if let index = out.firstIndex(where: { $0.name == field.name }) {
                out[index].value = field.value
            } else {
                out.append(field)
            }
        }
        return out
    }

    /// The request's values of the fields a response's `Vary` names, as stored beside it: `name=value` lines.
    static func varyKey(responseHeaders: [(name: String, value: String)], requestHeaders: [(name: String, value: String)]) -> String {
        guard let vary = field("vary", responseHeaders) else { return "" }
        let names = vary.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        return names.sorted().map { name in
            let value = requestHeaders.filter { $0.name.lowercased() == name }.map(\.value).joined(separator: ", ")
            return "\(name)=\(value)"
        }.joined(separator: "\n")
    }

    /// A field's value (any case of `name`; repeated ones joined with `", "`).
    static func field(_ name: String, _ headers: [(name: String, value: String)]) -> String? {
        let matches = headers.filter { $0.name.lowercased() == name }
        return matches.isEmpty ? nil : matches.map(\.value).joined(separator: ", ")
    }

    /// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) in ms since the epoch; `nil` for anything else.
    static func httpDateMs(_ text: String) -> Int64? {
        let parts = text.trimmingCharacters(in: .whitespaces).split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]), let year = Int(parts[3]),
            let month = months.firstIndex(of: String(parts[2])).map({ $0 + 1 })
        else { return nil }
        let time = parts[4].split(separator: ":").compactMap { Int($0) }
        guard time.count == 3 else { return nil }
        return Timestamp.epochMs(year: year, month: month, day: day, hour: time[0], minute: time[1], second: time[2])
    }

    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
}
