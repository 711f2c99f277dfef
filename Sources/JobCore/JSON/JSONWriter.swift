extension JSONValue {
    /// The compact JSON text of this value, as UTF-8 bytes.
    ///
    /// Written straight into the array's storage, sized once: a job's answer of 100 MB grown by doubling from a
    /// small buffer copied ~200 MB and touched fresh pages at each step, more than writing it took. Appending to the
    /// array instead, which checks its capacity and uniqueness on every append, wrote the 14 MB answer of 10,000
    /// results in 22.5 ms against 17.4 ms (medians of 30).
    /// The size is the text's without escapes and a margin for them; a text that needs more (many escapes) is
    /// written once more at the size the first pass counted.
    public var bytes: [UInt8] {
        ByteSink.bytes(unescapedCount: unescapedByteCount) { write(to: &$0) }
    }

    /// `bytes`, written into room for `expectedCount` bytes (and the margin `bytes` leaves for escapes) instead of
    /// room counted first: counting walks the value once more, which for a fetch's result was a fifth of writing
    /// its text (callgrind). A text longer than that is written once more at its own length; the array keeps the
    /// room it was given, so `expectedCount` should be the length of a text like it, such as the one before it in a
    /// run of results alike.
    public func bytes(expectedCount: Int) -> [UInt8] {
        ByteSink.bytes(unescapedCount: max(0, expectedCount)) { write(to: &$0) }
    }

    /// Appends the compact JSON text of this value to `out`, written in place at its end (sized as `bytes` sizes
    /// its array): no array of its own that is then copied, which for a fetch's body of 100 MB was 100 MB more.
    public func append(to out: inout [UInt8]) {
        let start = out.count
        var room = ByteSink.room(forUnescaped: unescapedByteCount)
        while true {
            // Zeroed, then written over: the pages are touched once either way.
            out.append(contentsOf: repeatElement(0, count: room))
            let needed = out.withUnsafeMutableBufferPointer { buffer in
                var sink = ByteSink(UnsafeMutableBufferPointer(rebasing: buffer[start...]))
                write(to: &sink)
                return sink.needed
            }
            out.removeLast(room - min(needed, room))
            if needed <= room { return }
            out.removeLast(out.count - start)
            room = needed
        }
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
            // Elements and members are read in place, through the buffer, not copied out one by one: each copy
            // retained and released its strings and arrays. With the strings read in place too (`writeString`), the
            // answer of a 1,000-fetch job (1.4 MB) is written in 1.36 ms rather than 1.75 (medians of 60, alternated).
            return elements.withUnsafeBufferPointer { elements in
                var total = 2 + max(0, elements.count - 1)
                for k in elements.indices { total += elements[k].unescapedByteCount }
                return total
            }
        case .object(let members):
            return members.withUnsafeBufferPointer { members in
                var total = 2 + max(0, members.count - 1)
                for k in members.indices { total += members[k].key.utf8.count + 3 + members[k].value.unescapedByteCount }
                return total
            }
        }
    }

    /// The compact JSON text of this value.
    public var text: String { String(decoding: bytes, as: UTF8.self) }

    /// Writes the compact JSON text of this value to `sink`.
    ///
    /// Values come from the parser (depth-limited) or from our own code, so
    /// the recursion here is bounded.
    func write(to sink: inout ByteSink) {
        switch self {
        case .null: sink.append("null")
        case .bool(let b): sink.append(b ? "true" : "false")
        case .number(let n): sink.append(n)
        case .string(let s): JSONValue.writeString(s, to: &sink)
        case .array(let elements):
            sink.append(UInt8(ascii: "["))
            elements.withUnsafeBufferPointer { elements in
                for k in elements.indices {
                    if k > 0 { sink.append(UInt8(ascii: ",")) }
                    elements[k].write(to: &sink)
                }
            }
            sink.append(UInt8(ascii: "]"))
        case .object(let members):
            members.withUnsafeBufferPointer { members in
                let start = sink.needed
                if sink.repeatsFlatObject(members) { return }
                var flat = members.count >= ByteSink.FlatObject.minimumMembers
                sink.append(UInt8(ascii: "{"))
                for k in members.indices {
                    if k > 0 { sink.append(UInt8(ascii: ",")) }
                    JSONValue.writeString(members[k].key, to: &sink)
                    sink.append(UInt8(ascii: ":"))
                    members[k].value.write(to: &sink)
                    if flat { flat = members[k].value.isScalar }
                }
                sink.append(UInt8(ascii: "}"))
                if flat, let storage = members.baseAddress {
                    sink.lastFlatObject = ByteSink.FlatObject(
                        storage: UnsafeRawPointer(storage), count: members.count, text: start..<sink.needed)
                }
            }
        }
    }

    /// Whether this is neither an array nor an object.
    var isScalar: Bool {
        switch self {
        case .array, .object: return false
        default: return true
        }
    }

    /// Writes `s` as a quoted, escaped JSON string.
    ///
    /// Runs of bytes that need no escape are copied whole: results hold long strings (bodies of kilobytes or
    /// megabytes), and most of their text needs none.
    static func writeString(_ s: String, to sink: inout ByteSink) {
        sink.append(UInt8(ascii: "\""))
        s.withUTF8InPlace { writeEscaped($0, to: &sink) }
        sink.append(UInt8(ascii: "\""))
    }

    /// Writes `bytes`, escaping what JSON requires, without the quotes.
    private static func writeEscaped(_ bytes: UnsafeBufferPointer<UInt8>, to sink: inout ByteSink) {
        guard let base = bytes.baseAddress else { return }
        let count = bytes.count
        // The loop starts where the check of the whole string stopped: the bytes before need no escape.
        var i = cleanPrefix(base, count: count)
        if i == count { return sink.append(base, count: count) }
        var runStart = 0
        let vectors = EscapeVectors.shared
        while i < count {
            // Sixteen bytes at a time, then eight, while none needs an escape: most of a body's text does not.
            if count &- i >= 16,
                !vectors.anyNeedsEscape(UnsafeRawPointer(base + i).loadUnaligned(as: SIMD16<UInt8>.self))
            {
                i &+= 16
                continue
            }
            if count - i >= 8, !JSONValue.mayNeedEscape(UnsafeRawPointer(base + i).loadUnaligned(as: UInt64.self)) {
                i += 8
                continue
            }
            let c = base[i]
            i += 1
            guard needsEscape(c) else { continue }
            sink.append(base + runStart, count: i - 1 - runStart)
            appendEscaped(c, to: &sink)
            runStart = i
        }
        sink.append(base + runStart, count: count - runStart)
    }

    /// How many of the `count` bytes from `base` are known to need no escape, from the first: `count` for a string
    /// with none, as most are; less where one may (`writeEscaped`'s loop then finds which, from there). Sixteen
    /// bytes at a time, then the last sixteen, or the first and last eight or four, read again from the end (bytes
    /// already found clean, read twice) rather than one by one: a fetch's result is mostly short strings (its header
    /// fields, its members' names), whose bytes one by one took about 10 instructions each (callgrind).
    @inline(__always)
    private static func cleanPrefix(_ base: UnsafePointer<UInt8>, count: Int) -> Int {
        let start = UnsafeRawPointer(base)
        if count >= 16 {
            let vectors = EscapeVectors.shared
            var i = 0
            while i &+ 16 <= count {
                if vectors.anyNeedsEscape(start.loadUnaligned(fromByteOffset: i, as: SIMD16<UInt8>.self)) { return i }
                i &+= 16
            }
            if i == count { return count }
            return vectors.anyNeedsEscape(start.loadUnaligned(fromByteOffset: count &- 16, as: SIMD16<UInt8>.self))
                ? i : count
        }
        if count >= 8 {
            let clean = !mayNeedEscape(start.loadUnaligned(as: UInt64.self))
                && !mayNeedEscape(start.loadUnaligned(fromByteOffset: count &- 8, as: UInt64.self))
            return clean ? count : 0
        }
        if count >= 4 {
            // Each four bytes twice over: the test is the eight bytes'.
            let first = UInt64(start.loadUnaligned(as: UInt32.self))
            let last = UInt64(start.loadUnaligned(fromByteOffset: count &- 4, as: UInt32.self))
            return !mayNeedEscape(first | first << 32) && !mayNeedEscape(last | last << 32) ? count : 0
        }
        for k in 0..<count where needsEscape(base[k]) { return k }
        return count
    }

    /// Whether `byte` is one JSON escapes in a string: a control byte, a quote or a backslash.
    @inline(__always)
    private static func needsEscape(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
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
    private static func appendEscaped(_ c: UInt8, to sink: inout ByteSink) {
        sink.append(0x5C)
        switch c {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"): sink.append(c)
        case 0x0A: sink.append(UInt8(ascii: "n"))
        case 0x0D: sink.append(UInt8(ascii: "r"))
        case 0x09: sink.append(UInt8(ascii: "t"))
        default:
            let hex: StaticString = "0123456789abcdef"
            sink.append("u00")
            hex.withUTF8Buffer { digits in
                sink.append(digits[Int(c >> 4)])
                sink.append(digits[Int(c & 0xF)])
            }
        }
    }
}

extension JSONValue: CustomStringConvertible {
    public var description: String { text }
}

/// The bytes a JSON string's text escapes, as vectors to compare sixteen bytes with at once (`JSONValue.writeEscaped`,
/// and the parser's strings). A scan of a 1 KiB string took 60 ms a million times, against 220 ms eight bytes at a
/// time (`JSONValue.mayNeedEscape`), which wrote a fetch's body at about 40 instructions a word (callgrind). Made once:
/// a vector made with `init(repeating:)` where it is compared was made lane by lane on every turn, 300 times slower.
struct EscapeVectors {
    let space = SIMD16<UInt8>(repeating: 0x20)
    let quote = SIMD16<UInt8>(repeating: 0x22)
    let backslash = SIMD16<UInt8>(repeating: 0x5C)
    let high = SIMD16<UInt8>(repeating: 0x80)

    static let shared = EscapeVectors()

    /// Whether any of the sixteen bytes of `bytes` is a control byte, a quote or a backslash.
    @inline(__always)
    func anyNeedsEscape(_ bytes: SIMD16<UInt8>) -> Bool {
        any((bytes .< space) .| (bytes .== quote) .| (bytes .== backslash))
    }
}

/// Where `JSONValue.bytes` writes: a buffer of fixed capacity that counts every byte given to it, and keeps them only
/// while they fit, so that a text longer than the buffer is measured by the same pass that found it too long.
struct ByteSink {
    private let base: UnsafeMutablePointer<UInt8>?
    private let capacity: Int
    /// Bytes given so far, kept or not.
    private(set) var needed = 0
    /// The last object of scalar members written, which the same members may be written as again.
    var lastFlatObject: FlatObject?

    /// An object of scalar members written (`JSONValue.write(to:)`): its members' storage and its text. The same
    /// storage written again is a copy of that text. A list of fetches from one server holds results whose `headers`
    /// objects are mostly one array (`HeaderObjects`): its 8 fields' 16 strings took about two fifths of writing
    /// each result. Storage is compared by address: every value a sink writes is held by its writer for the sink's
    /// life, so no storage it has seen is freed and made again meanwhile.
    struct FlatObject {
        /// Objects of fewer members are written anew: the check would cost about what it saves.
        static let minimumMembers = 4
        let storage: UnsafeRawPointer
        let count: Int
        let text: Range<Int>
    }

    init(_ buffer: UnsafeMutableBufferPointer<UInt8>) {
        base = buffer.baseAddress
        capacity = buffer.count
    }

    /// What `write` gives its sink, as an array sized once: `unescapedCount` (the text's length if no string needed
    /// an escape) and a margin for escapes; a text that needs more is written once more at the size counted.
    static func bytes(unescapedCount: Int, _ write: (inout ByteSink) -> Void) -> [UInt8] {
        var capacity = room(forUnescaped: unescapedCount)
        while true {
            var needed = 0
            let out = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
                var sink = ByteSink(buffer)
                write(&sink)
                needed = sink.needed
                initialized = sink.fits ? sink.needed : 0
            }
            if needed <= capacity { return out }
            capacity = needed
        }
    }

    /// The room a first pass writes a text into: its length without escapes (`unescapedCount`) and a margin for them.
    static func room(forUnescaped unescapedCount: Int) -> Int { unescapedCount + unescapedCount / 64 + 16 }

    /// Whether every byte given was kept.
    var fits: Bool { needed <= capacity }

    @inline(__always)
    mutating func append(_ byte: UInt8) {
        if needed < capacity, let base { (base + needed).initialize(to: byte) }
        needed += 1
    }

    @inline(__always)
    mutating func append(_ bytes: UnsafePointer<UInt8>, count: Int) {
        guard count > 0 else { return }
        if count <= capacity - needed, let base { (base + needed).initialize(from: bytes, count: count) }
        needed += count
    }

    mutating func append(_ text: String) {
        text.withUTF8InPlace { bytes in
            if let start = bytes.baseAddress { append(start, count: bytes.count) }
        }
    }

    mutating func append(_ text: StaticString) {
        text.withUTF8Buffer { bytes in
            if let start = bytes.baseAddress { append(start, count: bytes.count) }
        }
    }

    /// Whether `members` are those of `lastFlatObject`, whose text is then given again.
    mutating func repeatsFlatObject(_ members: UnsafeBufferPointer<JSONMember>) -> Bool {
        guard let last = lastFlatObject, last.count == members.count,
            let storage = members.baseAddress, last.storage == UnsafeRawPointer(storage)
        else { return false }
        let count = last.text.count
        // Its text is there only if it fitted; once a byte has not, none after it is kept either.
        if last.text.upperBound <= capacity, count <= capacity - needed, let base {
            (base + needed).initialize(from: base + last.text.lowerBound, count: count)
        }
        needed += count
        return true
    }

    /// Gives `count` bytes, which `fill` writes from the pointer it is passed if they fit (else it is not called).
    mutating func append(count: Int, _ fill: (UnsafeMutablePointer<UInt8>) -> Void) {
        if count <= capacity - needed, let base { fill(base + needed) }
        needed += count
    }
}

extension String {
    /// Calls `body` with the string's UTF-8 bytes, read where they are (any native string's are contiguous), and
    /// copied once only when they are not. Unlike `withUTF8`, it needs no `var`, whose copy of the string retains and
    /// releases it on every call: JSON writing and the URL check do this for every string they read.
    func withUTF8InPlace<R>(_ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        if let result = try utf8.withContiguousStorageIfAvailable(body) { return result }
        var copy = self
        return try copy.withUTF8(body)
    }
}
