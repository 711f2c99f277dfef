import Foundation

/// The URL work of a paginated fetch: `Link` headers, relative references, origins and query parameters.
enum PageURLs {
    /// The target of the first `rel="next"` link in a `Link` field value (RFC 8288 §3), as written.
    ///
    /// Repeated `Link` fields arrive joined with `", "`, which is also the separator of links within one field, so
    /// one scan reads both. A comma inside `<…>` or a quoted string does not end a link; `rel` may hold several
    /// space-separated types, matched without regard to case.
    static func nextLink(_ field: String) -> String? {
        let bytes = Array(field.utf8)
        var i = 0
        while i < bytes.count {
            while i < bytes.count, bytes[i] != UInt8(ascii: "<") { i += 1 }
            guard i < bytes.count else { return nil }
            let targetStart = i + 1
            guard let close = bytes[targetStart...].firstIndex(of: UInt8(ascii: ">")) else { return nil }
            let target = String(decoding: bytes[targetStart..<close], as: UTF8.self)
            i = close + 1
            // Parameters up to the next comma outside quotes.
            var params: [(String, String)] = []
            while i < bytes.count, bytes[i] != UInt8(ascii: ",") {
                if bytes[i] == UInt8(ascii: ";") {
                    i += 1
                    var name: [UInt8] = []
                    while i < bytes.count, ![UInt8(ascii: "="), UInt8(ascii: ";"), UInt8(ascii: ",")].contains(bytes[i]) {
                        name.append(bytes[i])
                        i += 1
                    }
                    var value: [UInt8] = []
                    if i < bytes.count, bytes[i] == UInt8(ascii: "=") {
                        i += 1
                        while i < bytes.count, bytes[i] == UInt8(ascii: " ") || bytes[i] == UInt8(ascii: "\t") { i += 1 }
                        if i < bytes.count, bytes[i] == UInt8(ascii: "\"") {
                            i += 1
                            while i < bytes.count, bytes[i] != UInt8(ascii: "\"") {
                                if bytes[i] == UInt8(ascii: "\\"), i + 1 < bytes.count { i += 1 }
                                value.append(bytes[i])
                                i += 1
                            }
                            if i < bytes.count { i += 1 }
                        } else {
                            while i < bytes.count, bytes[i] != UInt8(ascii: ";"), bytes[i] != UInt8(ascii: ",") {
                                value.append(bytes[i])
                                i += 1
                            }
                        }
                    }
                    let key = String(decoding: name, as: UTF8.self).trimmingCharacters(in: .whitespaces).lowercased()
                    params.append((key, String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespaces)))
                } else {
                    i += 1
                }
            }
            // RFC 8288 §3.3: only the first `rel` of a link counts.
            if let rel = params.first(where: { $0.0 == "rel" })?.1,
                rel.lowercased().split(whereSeparator: { $0 == " " || $0 == "\t" }).contains("next")
            {
                return target
            }
        }
        return nil
    }

    /// `reference` resolved against `base` (RFC 3986 §5), or `nil` when it cannot be read as a URL.
    static func resolve(_ reference: String, against base: String) -> String? {
        guard let baseURL = URL(string: base), let url = URL(string: reference, relativeTo: baseURL) else { return nil }
        return url.absoluteURL.absoluteString
    }

    /// `scheme://host:port` with the scheme and host lowercased and the default port spelled out, or `nil`.
    static func origin(_ url: String) -> String? {
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            let host = components.host?.lowercased(), !host.isEmpty
        else { return nil }
        let port = components.port ?? (scheme == "https" ? 443 : 80)
        return "\(scheme)://\(host):\(port)"
    }

    /// `url` with query parameter `name` set to `value`: each pair of that name is replaced (the first keeps its
    /// place, later ones go), or the pair is appended before any fragment. Both are percent-encoded.
    static func settingQuery(_ url: String, name: String, value: String) -> String {
        var rest = Substring(url)
        var fragment = ""
        if let hash = rest.firstIndex(of: "#") {
            fragment = String(rest[hash...])
            rest = rest[..<hash]
        }
        var query: Substring = ""
        if let question = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: question)...]
            rest = rest[..<question]
        }
        let encodedName = ExpressionResolver.percentEncode(name)
        let pair = encodedName + "=" + ExpressionResolver.percentEncode(value)
        var pairs: [String] = []
        var replaced = false
        for part in query.split(separator: "&", omittingEmptySubsequences: true) {
            let partName = part.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            if partName == encodedName[...] || partName.removingPercentEncoding == name {
                if !replaced { pairs.append(pair) }
                replaced = true
            } else {
                pairs.append(String(part))
            }
        }
        if !replaced { pairs.append(pair) }
        return String(rest) + "?" + pairs.joined(separator: "&") + fragment
    }
}
