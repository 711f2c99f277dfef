/// Job ids: 26 characters of Crockford base32 — 48 bits of milliseconds, then
/// 80 random bits — so that ids sort by creation time (a ULID). Ids made in the
/// same millisecond by one generator increase by one.
struct JobIDGenerator {
    private static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)
    private var lastMs: Int64 = -1
    private var lastRandom: (high: UInt16, low: UInt64) = (0, 0)
    private var rng = SystemRandomNumberGenerator()

    mutating func next(nowMs: Int64) -> String {
        if nowMs <= lastMs {
            // Same (or an earlier) millisecond: keep order by counting up.
            let (low, overflow) = lastRandom.low.addingReportingOverflow(1)
            lastRandom = (overflow ? lastRandom.high &+ 1 : lastRandom.high, low)
        } else {
            lastMs = nowMs
            lastRandom = (UInt16.random(in: 0...UInt16.max, using: &rng) & 0x7FFF, UInt64.random(in: 0...UInt64.max, using: &rng))
        }
        var out = [UInt8](repeating: 0, count: 26)
        var time = UInt64(max(0, lastMs))
        for i in stride(from: 9, through: 0, by: -1) {
            out[i] = Self.alphabet[Int(time & 31)]
            time >>= 5
        }
        // 80 random bits: 16 high, 64 low, written 5 bits at a time from the end.
        var low = lastRandom.low
        var high = UInt64(lastRandom.high)
        for i in stride(from: 25, through: 10, by: -1) {
            out[i] = Self.alphabet[Int(low & 31)]
            low = (low >> 5) | ((high & 31) << 59)
            high >>= 5
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// A 64-bit FNV-1a hash in hex, used to tell whether two submissions with the same idempotency key carry the same body.
func fnv1aHex(_ bytes: [UInt8]) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in bytes {
        hash ^= UInt64(b)
        hash = hash &* 0x0000_0100_0000_01B3
    }
    let hex = String(hash, radix: 16)
    return String(repeating: "0", count: 16 - hex.count) + hex
}
