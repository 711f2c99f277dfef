/// Why a JSON text was refused.
public struct JSONParseError: Error, Equatable, CustomStringConvertible, Sendable {
    /// The reason, in words.
    public var message: String
    /// Byte offset in the input where it went wrong.
    public var offset: Int
    /// JSON Pointer to the value being read when it went wrong.
    public var pointer: String
    /// True when the text was refused only because it nests deeper than allowed.
    public var isTooDeep: Bool

    public var description: String { "\(message) at byte \(offset)" }
}

extension JSONValue {
    /// Parses a complete JSON text (RFC 8259), with nothing but white space after it.
    ///
    /// The parser keeps its own stack instead of recursing, so input nested
    /// deeper than `maxDepth` is refused with an error rather than exhausting
    /// the thread's stack. Parsing is linear in the input. The default depth is the one for fetched
    /// response bodies; request bodies and stored JSON pass theirs (`Limits`).
    /// - Throws: `JSONParseError`.
    public static func parse<Bytes: Collection>(_ input: Bytes, maxDepth: Int = Limits.responseJSONDepth) throws
        -> JSONValue
    where Bytes.Element == UInt8 {
        if let result = try input.withContiguousStorageIfAvailable({ buffer in
            var parser = JSONParser(bytes: buffer, maxDepth: maxDepth)
            return try parser.parseDocument()
        }) {
            return result
        }
        let copy = Array(input)
        return try copy.withUnsafeBufferPointer { buffer in
            var parser = JSONParser(bytes: buffer, maxDepth: maxDepth)
            return try parser.parseDocument()
        }
    }

    /// Parses JSON from a string.
    public static func parse(_ text: String, maxDepth: Int = Limits.responseJSONDepth) throws -> JSONValue {
        try parse(Array(text.utf8), maxDepth: maxDepth)
    }
}

private struct JSONParser {
    /// An open array or object. Its finished elements (or members) wait in the parser's shared `elements`
    /// (or `members`) buffer from `start` on, so appending never copies a container that is also held elsewhere:
    /// each value is moved once into the array that finally holds it, which keeps parsing linear in the input.
    private struct Frame {
        var isObject: Bool
        var start: Int
    }

    let bytes: UnsafeBufferPointer<UInt8>
    let maxDepth: Int
    var index = 0
    private var stack: [Frame] = []
    /// Elements of the open arrays, innermost last.
    private var elements: [JSONValue] = []
    /// Members of the open objects, innermost last.
    private var members: [JSONMember] = []
    /// The key being read in each open object, innermost last (`""` while the key itself is read).
    private var keys: [String] = []

    init(bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
        self.bytes = bytes
        self.maxDepth = maxDepth
    }

    mutating func parseDocument() throws -> JSONValue {
        let value = try parseValueIteratively()
        skipWhitespace()
        if index != bytes.count { throw fail("unexpected data after the JSON value") }
        return value
    }

    private mutating func parseValueIteratively() throws -> JSONValue {
        while true {
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            var produced: JSONValue
            switch bytes[index] {
            case UInt8(ascii: "{"):
                index += 1
                try push(Frame(isObject: true, start: members.count))
                keys.append("")
                skipWhitespace()
                if peek() == UInt8(ascii: "}") {
                    index += 1
                    stack.removeLast()
                    keys.removeLast()
                    produced = .object([])
                } else {
                    keys[keys.count - 1] = try parseKey()
                    continue
                }
            case UInt8(ascii: "["):
                index += 1
                try push(Frame(isObject: false, start: elements.count))
                skipWhitespace()
                if peek() == UInt8(ascii: "]") {
                    index += 1
                    stack.removeLast()
                    produced = .array([])
                } else {
                    continue
                }
            default:
                produced = try parseScalar()
            }
            // Hand the finished value to the enclosing containers, closing as many as end here.
            while let top = stack.last {
                skipWhitespace()
                let next = peek()
                if top.isObject {
                    members.append(JSONMember(keys[keys.count - 1], produced))
                    if next == UInt8(ascii: ",") {
                        index += 1
                        keys[keys.count - 1] = ""
                        keys[keys.count - 1] = try parseKey()
                        break
                    } else if next == UInt8(ascii: "}") {
                        index += 1
                        produced = .object(Array(members[top.start...]))
                        members.removeSubrange(top.start...)
                        keys.removeLast()
                        stack.removeLast()
                    } else {
                        throw fail("expected ',' or '}' in object")
                    }
                } else {
                    elements.append(produced)
                    if next == UInt8(ascii: ",") {
                        index += 1
                        break
                    } else if next == UInt8(ascii: "]") {
                        index += 1
                        produced = .array(Array(elements[top.start...]))
                        elements.removeSubrange(top.start...)
                        stack.removeLast()
                    } else {
                        throw fail("expected ',' or ']' in array")
                    }
                }
            }
            if stack.isEmpty { return produced }
        }
    }

    private mutating func push(_ frame: Frame) throws {
        if stack.count >= maxDepth {
            throw JSONParseError(
                message: "JSON nested deeper than \(maxDepth) levels", offset: index, pointer: pointer(),
                isTooDeep: true)
        }
        stack.append(frame)
    }

    /// Reads `"key"` and the colon after it.
    private mutating func parseKey() throws -> String {
        skipWhitespace()
        guard peek() == UInt8(ascii: "\"") else { throw fail("expected a string key in object") }
        let key = try parseString()
        skipWhitespace()
        guard peek() == UInt8(ascii: ":") else { throw fail("expected ':' after object key") }
        index += 1
        return key
    }

    private mutating func parseScalar() throws -> JSONValue {
        switch bytes[index] {
        case UInt8(ascii: "\""):
            return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try parseNumber()
        default:
            throw fail("unexpected character")
        }
    }

    private mutating func expectLiteral(_ word: StaticString) throws {
        let count = word.utf8CodeUnitCount
        guard bytes.count - index >= count else { throw fail("invalid literal") }
        for i in 0..<count where bytes[index + i] != word.utf8Start[i] {
            throw fail("invalid literal")
        }
        index += count
    }

    private mutating func parseNumber() throws -> JSONValue {
        let start = index
        if peek() == UInt8(ascii: "-") { index += 1 }
        guard let first = peek(), isDigit(first) else { throw fail("invalid number") }
        if first == UInt8(ascii: "0") {
            index += 1
        } else {
            while let c = peek(), isDigit(c) { index += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            index += 1
            guard let c = peek(), isDigit(c) else { throw fail("invalid number: digits expected after '.'") }
            while let c = peek(), isDigit(c) { index += 1 }
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            index += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index += 1 }
            guard let c = peek(), isDigit(c) else { throw fail("invalid number: digits expected in exponent") }
            while let c = peek(), isDigit(c) { index += 1 }
        }
        return .number(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
    }

    private mutating func parseString() throws -> String {
        index += 1  // opening quote
        let start = index
        // Fast path: no escapes.
        var bitsSeen: UInt8 = 0
        if let base = bytes.baseAddress {
            // Sixteen bytes at a time, then eight, while none is a quote, a backslash or a control byte (as the
            // writer scans): byte by byte, a fetch's 1 KiB JSON body took 15 instructions a byte to read
            // (callgrind), on the fetcher's thread. The bytes after the last clean word are read one by one below.
            let vectors = EscapeVectors.shared
            var nonASCII = SIMDMask<SIMD16<Int8>>(repeating: false)
            while bytes.count &- index >= 16 {
                let vector = UnsafeRawPointer(base + index).loadUnaligned(as: SIMD16<UInt8>.self)
                if vectors.anyNeedsEscape(vector) { break }
                nonASCII = nonASCII .| (vector .>= vectors.high)
                index &+= 16
            }
            var highBits: UInt64 = 0
            while bytes.count - index >= 8 {
                let word = UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self)
                if JSONValue.mayNeedEscape(word) { break }
                highBits |= word
                index += 8
            }
            if highBits & 0x8080_8080_8080_8080 != 0 || any(nonASCII) { bitsSeen = 0x80 }
        }
        while index < bytes.count {
            let c = bytes[index]
            if c == UInt8(ascii: "\"") {
                let slice = UnsafeBufferPointer(rebasing: bytes[start..<index])
                // ASCII needs no validation; `String(validating:)` costs a generic metadata lookup on every call.
                let s: String
                if bitsSeen < 0x80 {
                    s = String(decoding: slice, as: UTF8.self)
                } else {
                    guard let valid = String(validating: slice, as: UTF8.self) else {
                        throw fail("invalid UTF-8 in string")
                    }
                    s = valid
                }
                index += 1
                return s
            }
            bitsSeen |= c
            if c == UInt8(ascii: "\\") { break }
            if c < 0x20 { throw fail("control character in string") }
            index += 1
        }
        var out = Array(UnsafeBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let c = bytes[index]
            switch c {
            case UInt8(ascii: "\""):
                index += 1
                guard let s = String(validating: out, as: UTF8.self) else { throw fail("invalid UTF-8 in string") }
                return s
            case UInt8(ascii: "\\"):
                index += 1
                guard let e = peek() else { throw fail("unexpected end of input in string") }
                index += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try parseHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard peek() == UInt8(ascii: "\\"), index + 1 < bytes.count, bytes[index + 1] == UInt8(ascii: "u")
                        else { throw fail("unpaired surrogate in string") }
                        index += 2
                        let low = try parseHex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail("unpaired surrogate in string") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw fail("unpaired surrogate in string")
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw fail("invalid escape in string") }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                default:
                    throw fail("invalid escape in string")
                }
            default:
                if c < 0x20 { throw fail("control character in string") }
                out.append(c)
                index += 1
            }
        }
        throw fail("unexpected end of input in string")
    }

    private mutating func parseHex4() throws -> UInt32 {
        guard bytes.count - index >= 4 else { throw fail("invalid \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    private func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }
    private func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    private func pointer() -> String {
        // Walk from the innermost frame out: an array's own elements end where the next array inside it starts.
        var tokens: [String] = []
        tokens.reserveCapacity(stack.count)
        var objectLevel = keys.count
        var innerArrayStart = elements.count
        for frame in stack.reversed() {
            if frame.isObject {
                objectLevel -= 1
                tokens.append(keys[objectLevel])
            } else {
                tokens.append(String(innerArrayStart - frame.start))
                innerArrayStart = frame.start
            }
        }
        return JSONPointer.make(tokens.reversed())
    }

    private func fail(_ message: String) -> JSONParseError {
        JSONParseError(message: message, offset: index, pointer: pointer(), isTooDeep: false)
    }
}

/// JSON Pointers (RFC 6901).
public enum JSONPointer {
    /// Joins reference tokens into a pointer, escaping `~` and `/`.
    public static func make<S: Sequence>(_ tokens: S) -> String where S.Element == String {
        var out = ""
        for token in tokens {
            out += "/"
            out += escape(token)
        }
        return out
    }

    /// Escapes one reference token.
    public static func escape(_ token: String) -> String {
        // A byte scan: `String.contains` would go through Foundation's locale-aware search where it is imported.
        guard token.utf8.contains(where: { $0 == UInt8(ascii: "~") || $0 == UInt8(ascii: "/") }) else { return token }
        var out: [UInt8] = []
        out.reserveCapacity(token.utf8.count + 8)
        for c in token.utf8 {
            switch c {
            case UInt8(ascii: "~"): out += [UInt8(ascii: "~"), UInt8(ascii: "0")]
            case UInt8(ascii: "/"): out += [UInt8(ascii: "~"), UInt8(ascii: "1")]
            default: out.append(c)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
