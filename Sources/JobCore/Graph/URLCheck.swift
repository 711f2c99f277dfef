/// Checks on the strings of a fetch: its URL and header names.
enum URLCheck {
    /// What is wrong with `url` as a fetch target, or `nil` when it is an absolute http/https URL with a host.
    ///
    /// Only printable ASCII is accepted (RFC 3986 has no raw non-ASCII), so what the
    /// client wrote is exactly what libcurl sends.
    static func problem(_ url: String, maxBytes: Int) -> String? {
        // Read in place, with no string made from its bytes: every fetch of a job is checked, this check was a tenth
        // of validating a list of fetches, and the copy, the lowercased scheme and the port's string a third of it.
        url.withUTF8InPlace { problem(bytes: $0, maxBytes: maxBytes) }
    }

    private static func problem(bytes: UnsafeBufferPointer<UInt8>, maxBytes: Int) -> String? {
        if bytes.count > maxBytes { return "must be at most \(maxBytes) bytes" }
        // One pass for both: white space or a control byte anywhere is reported before a byte that is not ASCII.
        var sawControl = false
        var sawNonASCII = false
        for c in bytes {
            if c <= 0x20 || c == 0x7F { sawControl = true }
            if c >= 0x80 { sawNonASCII = true }
        }
        if sawControl { return "must not contain white space or control characters" }
        if sawNonASCII { return "must be ASCII; percent-encode other characters" }

        // scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":"
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")), colon > 0, isAlpha(bytes[0]),
            bytes[1..<colon].allSatisfy({ isAlpha($0) || isDigit($0) || $0 == 0x2B || $0 == 0x2D || $0 == 0x2E })
        else {
            return "must be an absolute http or https URL (http://host/path)"
        }
        guard isHTTPScheme(bytes[0..<colon]) else { return "scheme must be http or https" }
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

        var portPart: Slice<UnsafeBufferPointer<UInt8>>?
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
                (1...65535).contains(port.reduce(0) { $0 * 10 + Int($1 - 0x30) })
            else { return "has an invalid port (1 to 65535)" }
        }
        return nil
    }

    /// True for an RFC 9110 token: the form of a header field name.
    static func isToken(_ s: String) -> Bool {
        !s.isEmpty
            && s.utf8.allSatisfy { c in
                isAlpha(c) || isDigit(c) || isOneOf(c, "!#$%&'*+-.^_`|~")
            }
    }

    private static func isAlpha(_ c: UInt8) -> Bool { (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) }
    private static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }
    private static func isHexDigit(_ c: UInt8) -> Bool {
        isDigit(c) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
    }
    /// unreserved / pct-encoded / sub-delims (RFC 3986 reg-name).
    private static func isRegNameByte(_ c: UInt8) -> Bool {
        isAlpha(c) || isDigit(c) || isOneOf(c, "-._~%!$&'()*+,;=")
    }
    /// Whether `c` is one of the ASCII characters of `set`, read in place: searching a `String`'s UTF-8 view instead
    /// took a tenth of the URL check.
    private static func isOneOf(_ c: UInt8, _ set: StaticString) -> Bool {
        set.withUTF8Buffer { $0.contains(c) }
    }
    /// Whether `scheme` is `http` or `https`, in either case. Byte by byte: comparing it with each name's UTF-8 view
    /// went through a generic `elementsEqual`, a fifth of the URL check.
    private static func isHTTPScheme(_ scheme: Slice<UnsafeBufferPointer<UInt8>>) -> Bool {
        guard scheme.count == 4 || scheme.count == 5 else { return false }
        let s = scheme.startIndex
        // `| 0x20` makes an ASCII letter lowercase; a digit or a sign it leaves unlike any of these letters.
        guard scheme[s] | 0x20 == UInt8(ascii: "h"), scheme[s + 1] | 0x20 == UInt8(ascii: "t"),
            scheme[s + 2] | 0x20 == UInt8(ascii: "t"), scheme[s + 3] | 0x20 == UInt8(ascii: "p")
        else { return false }
        return scheme.count == 4 || scheme[s + 4] | 0x20 == UInt8(ascii: "s")
    }
}
