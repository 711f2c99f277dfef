extension JSONValue {
    /// The compact JSON text of this value, as UTF-8 bytes.
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        // Sized once: a job's answer of 100 MB grown by doubling from a small buffer copied ~200 MB and touched
        // fresh pages at each step, more than writing it took.
        out.reserveCapacity(max(64, unescapedByteCount))
        write(to: &out)
        return out
    }

    /// The length of the compact text if no string needed an escape: a lower bound, found without writing.
    ///
    /// Recursive like `write(to:)`, so bounded in the same way.
    public var unescapedByteCount: Int {
        switch self {
        case .null: return 4
        case .bool(let b): return b ? 4 : 5
        case .number(let n): return n.utf8.count
        case .string(let s): return s.utf8.count + 2
        case .array(let elements):
            var total = 2 + max(0, elements.count - 1)
            for element in elements { total += element.unescapedByteCount }
            return total
        case .object(let members):
            var total = 2 + max(0, members.count - 1)
            for member in members { total += member.key.utf8.count + 3 + member.value.unescapedByteCount }
            return total
        }
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
        case .bool(let b): out.append(contentsOf: b ? "true".utf8 : "false".utf8)
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
            var i = 0
            while i < bytes.count {
                // Eight bytes at a time while none needs an escape: most of a body's text does not.
                if bytes.count - i >= 8, let base = bytes.baseAddress,
                    !JSONValue.mayNeedEscape(UnsafeRawPointer(base + i).loadUnaligned(as: UInt64.self))
                {
                    i += 8
                    continue
                }
                let c = bytes[i]
                i += 1
                guard c < 0x20 || c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") else { continue }
                if runStart < i - 1 { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<(i - 1)])) }
                appendEscaped(c, to: &out)
                runStart = i
            }
            if runStart < bytes.count {
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<bytes.count]))
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Whether any of the eight bytes in `word` may be a control byte, a quote or a backslash: never false when one
    /// is; it may be true when none is (the byte-wise check then settles it).
    @inline(__always)
    static func mayNeedEscape(_ word: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        let quote = word ^ (ones &* 0x22)
        let backslash = word ^ (ones &* 0x5C)
        // A byte below 0x20, or one that the xor made zero: the classic "has a byte less than n" test.
        let below = (word &- ones &* 0x20) & ~word
        let zeroQuote = (quote &- ones) & ~quote
        let zeroBackslash = (backslash &- ones) & ~backslash
        return (below | zeroQuote | zeroBackslash) & highs != 0
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
