extension JSONValue {
    /// The compact JSON text of this value, as UTF-8 bytes.
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        write(to: &out)
        return out
    }

    /// The compact JSON text of this value.
    public var text: String { String(decoding: bytes, as: UTF8.self) }

    /// Appends the compact JSON text of this value to `out`.
    ///
    /// Values come from the parser (depth-limited) or from our own code, so
    /// the recursion here is bounded.
    public func write(to out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C])
        case .bool(let b): out.append(contentsOf: b ? Array("true".utf8) : Array("false".utf8))
        case .number(let n): out.append(contentsOf: n.utf8)
        case .string(let s): JSONValue.writeString(s, to: &out)
        case .array(let elements):
            out.append(UInt8(ascii: "["))
            for (i, element) in elements.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                element.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (i, member) in members.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.writeString(member.key, to: &out)
                out.append(UInt8(ascii: ":"))
                member.value.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// Appends `s` as a quoted, escaped JSON string.
    ///
    /// Runs of bytes that need no escape are copied whole: results hold long strings (bodies of kilobytes or
    /// megabytes), and a byte-at-a-time append spent most of a large write checking the array's capacity.
    public static func writeString(_ s: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var text = s
        text.withUTF8 { bytes in
            var runStart = 0
            for i in bytes.indices {
                let c = bytes[i]
                guard c < 0x20 || c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") else { continue }
                if runStart < i { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<i])) }
                appendEscaped(c, to: &out)
                runStart = i + 1
            }
            if runStart < bytes.count {
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<bytes.count]))
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Appends the escape of a quote, a backslash or a control byte.
    private static func appendEscaped(_ c: UInt8, to out: inout [UInt8]) {
        switch c {
        case UInt8(ascii: "\""): out.append(contentsOf: [0x5C, 0x22])
        case UInt8(ascii: "\\"): out.append(contentsOf: [0x5C, 0x5C])
        case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
        case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
        case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
        default:
            let hex: StaticString = "0123456789abcdef"
            out.append(contentsOf: [0x5C, UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
            hex.withUTF8Buffer { digits in
                out.append(digits[Int(c >> 4)])
                out.append(digits[Int(c & 0xF)])
            }
        }
    }
}

extension JSONValue: CustomStringConvertible {
    public var description: String { text }
}
