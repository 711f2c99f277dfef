/// Checks `Authorization: Bearer <token>` against the configured token.
struct BearerAuth {
    private let token: [UInt8]

    init(token: String) { self.token = Array(token.utf8) }

    /// True when `header` (the `Authorization` value, if any) carries the token.
    func allows(_ header: String?) -> Bool {
        guard let header else { return false }
        let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return false }
        return Self.constantTimeEqual(Array(parts[1].utf8), token)
    }

    /// Compares without stopping at the first difference, so the time taken says nothing of
    /// how much of a guessed token was right; only the length may show.
    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var difference = UInt8(truncatingIfNeeded: a.count ^ b.count)
        difference |= UInt8(truncatingIfNeeded: (a.count ^ b.count) >> 8)
        let n = max(a.count, b.count)
        for i in 0..<n {
            let x = i < a.count ? a[i] : 0
            let y = i < b.count ? b[i] : 0
            difference |= x ^ y
        }
        return difference == 0 && a.count == b.count
    }
}
