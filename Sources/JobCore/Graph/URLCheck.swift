/// Checks on the strings of a fetch: its URL and header names.
enum URLCheck {
    /// What is wrong with `url` as a fetch target, or `nil` when it is an absolute http/https URL with a host.
    ///
    /// Only printable ASCII is accepted (RFC 3986 has no raw non-ASCII), so what the
    /// client wrote is exactly what libcurl sends.
    static func problem(_ url: String, maxBytes: Int) -> String? {
        let bytes = Array(url.utf8)
        if bytes.count > maxBytes { return "must be at most \(maxBytes) bytes" }
        if bytes.contains(where: { $0 <= 0x20 || $0 == 0x7F }) {
            return "must not contain white space or control characters"
        }
        if bytes.contains(where: { $0 >= 0x80 }) { return "must be ASCII; percent-encode other characters" }

        // scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":"
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")), colon > 0, isAlpha(bytes[0]),
            bytes[1..<colon].allSatisfy({ isAlpha($0) || isDigit($0) || $0 == 0x2B || $0 == 0x2D || $0 == 0x2E })
        else {
            return "must be an absolute http or https URL (http://host/path)"
        }
        let scheme = String(decoding: bytes[0..<colon], as: UTF8.self).lowercased()
        guard scheme == "http" || scheme == "https" else { return "scheme must be http or https" }
        let afterScheme = colon + 1
        guard bytes.count >= afterScheme + 2, bytes[afterScheme] == 0x2F, bytes[afterScheme + 1] == 0x2F else {
            return "must be an absolute http or https URL (http://host/path)"
        }
        let authorityStart = afterScheme + 2
        let authorityEnd =
            bytes[authorityStart...].firstIndex(where: { $0 == 0x2F || $0 == 0x3F || $0 == 0x23 }) ?? bytes.count
        var authority = bytes[authorityStart..<authorityEnd]
        if let at = authority.lastIndex(of: UInt8(ascii: "@")) {
            authority = authority[(at + 1)...]
        }

        var portPart: ArraySlice<UInt8>?
        if authority.first == UInt8(ascii: "[") {
            guard let close = authority.firstIndex(of: UInt8(ascii: "]")) else { return "has an invalid host" }
            let literal = authority[(authority.startIndex + 1)..<close]
            guard !literal.isEmpty,
                literal.allSatisfy({ isHexDigit($0) || $0 == 0x3A || $0 == 0x2E })
            else { return "has an invalid host" }
            let rest = authority[(close + 1)...]
            if !rest.isEmpty {
                guard rest.first == UInt8(ascii: ":") else { return "has an invalid host" }
                portPart = rest.dropFirst()
            }
        } else {
            let hostEnd = authority.firstIndex(of: UInt8(ascii: ":")) ?? authority.endIndex
            let host = authority[authority.startIndex..<hostEnd]
            guard !host.isEmpty else { return "must have a host" }
            guard host.allSatisfy(isRegNameByte) else { return "has an invalid host" }
            if hostEnd < authority.endIndex { portPart = authority[(hostEnd + 1)...] }
        }
        if let port = portPart {
            guard !port.isEmpty, port.count <= 5, port.allSatisfy(isDigit),
                let n = Int(String(decoding: port, as: UTF8.self)), (1...65535).contains(n)
            else { return "has an invalid port (1 to 65535)" }
        }
        return nil
    }

    /// True for an RFC 9110 token: the form of a header field name.
    static func isToken(_ s: String) -> Bool {
        !s.isEmpty
            && s.utf8.allSatisfy { c in
                isAlpha(c) || isDigit(c) || "!#$%&'*+-.^_`|~".utf8.contains(c)
            }
    }

    private static func isAlpha(_ c: UInt8) -> Bool { (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) }
    private static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }
    private static func isHexDigit(_ c: UInt8) -> Bool {
        isDigit(c) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
    }
    /// unreserved / pct-encoded / sub-delims (RFC 3986 reg-name).
    private static func isRegNameByte(_ c: UInt8) -> Bool {
        isAlpha(c) || isDigit(c) || "-._~%!$&'()*+,;=".utf8.contains(c)
    }
}
