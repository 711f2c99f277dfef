// The job fields of API.md §8 that say when a job may run: `not_before`, `concurrency_key`, `concurrency_limit`.
// They are taken out of the body before the graph validator sees it, as the data-flow fields are, so that the
// validator's field list stays the graph's.

/// When and beside which other jobs a job may run.
public struct ScheduleOptions: Equatable, Sendable {
    /// The job stays pending until then (milliseconds since the Unix epoch).
    public var notBefore: Int64?
    /// Jobs sharing a key run at most `concurrencyLimit` at once, in submission order.
    public var concurrencyKey: String?
    /// 1–1000; `nil` without a key (a key alone means 1).
    public var concurrencyLimit: Int?

    public init(notBefore: Int64? = nil, concurrencyKey: String? = nil, concurrencyLimit: Int? = nil) {
        self.notBefore = notBefore
        self.concurrencyKey = concurrencyKey
        self.concurrencyLimit = concurrencyLimit
    }

    static let fields: Set<String> = ["not_before", "concurrency_key", "concurrency_limit"]
    /// `not_before` may be at most this far ahead of the submission.
    public static let maxAheadMs: Int64 = 366 * 86_400_000
    public static let maxKeyCharacters = 200
    public static let limitRange = 1...1000

    /// Reads and removes the scheduling fields of a job body.
    /// - Parameters:
    ///   - body: the submitted body (a non-object is left for the validator to refuse).
    ///   - nowMs: the time `not_before` is checked against.
    /// - Returns: the body without those fields, the options, and the problems found, each with its JSON Pointer
    ///   and the member's position (for the order of the 422's issues).
    static func take(from body: JSONValue, nowMs: Int64) -> (
        body: JSONValue, options: ScheduleOptions, issues: [(pointer: String, message: String, key: [Int])]
    ) {
        guard case .object(let members) = body, members.contains(where: { fields.contains($0.key) }) else {
            return (body, ScheduleOptions(), [])
        }
        var options = ScheduleOptions()
        var issues: [(pointer: String, message: String, key: [Int])] = []
        var kept: [JSONMember] = []
        var seen: Set<String> = []
        for (position, member) in members.enumerated() {
            guard fields.contains(member.key) else {
                kept.append(member)
                continue
            }
            let pointer = "/" + member.key
            let key = [position]
            guard seen.insert(member.key).inserted else {
                issues.append((pointer, "duplicate field", key))
                continue
            }
            switch member.key {
            case "not_before":
                guard case .string(let text) = member.value else {
                    issues.append((pointer, "must be an RFC 3339 time string, e.g. \"2026-12-02T08:11:28.123Z\"", key))
                    continue
                }
                guard let ms = RFC3339.parse(text) else {
                    issues.append((pointer, "must be an RFC 3339 time with a time zone, e.g. \"2026-12-02T08:11:28.123Z\"", key))
                    continue
                }
                if ms > nowMs + maxAheadMs {
                    issues.append((pointer, "must be at most 366 days ahead", key))
                    continue
                }
                options.notBefore = ms
            case "concurrency_key":
                guard case .string(let text) = member.value else {
                    issues.append((pointer, "must be a string", key))
                    continue
                }
                if text.isEmpty || text.unicodeScalars.count > maxKeyCharacters {
                    issues.append((pointer, "must be 1 to \(maxKeyCharacters) characters", key))
                    continue
                }
                options.concurrencyKey = text
            default:  // concurrency_limit
                guard let n = member.value.intValue, limitRange.contains(n), case .number = member.value else {
                    issues.append((pointer, "must be an integer from \(limitRange.lowerBound) to \(limitRange.upperBound)", key))
                    continue
                }
                options.concurrencyLimit = n
            }
        }
        if options.concurrencyLimit != nil, options.concurrencyKey == nil, !seen.contains("concurrency_key") {
            issues.append(("/concurrency_limit", "needs a concurrency_key", [members.count]))
        }
        if options.concurrencyKey != nil, options.concurrencyLimit == nil { options.concurrencyLimit = 1 }
        return (.object(kept), options, issues)
    }
}

/// RFC 3339 date-times (`2026-12-02T08:11:28.123Z`, `2026-12-02T09:11:28+01:00`) to milliseconds since the epoch.
public enum RFC3339 {
    /// `nil` unless `text` is a full date-time with seconds and a zone (`Z` or `±HH:MM`); fractions past the
    /// millisecond are cut.
    public static func parse(_ text: String) -> Int64? {
        let b = Array(text.utf8)
        var i = 0
        func digits(_ n: Int) -> Int? {
            guard i + n <= b.count else { return nil }
            var v = 0
            for k in i..<(i + n) {
                guard (48...57).contains(b[k]) else { return nil }
                v = v * 10 + Int(b[k] - 48)
            }
            i += n
            return v
        }
        func expect(_ c: UInt8...) -> Bool {
            guard i < b.count, c.contains(b[i]) else { return false }
            i += 1
            return true
        }
        guard let year = digits(4), expect(45), let month = digits(2), expect(45), let day = digits(2),
            expect(84, 116, 32), let hour = digits(2), expect(58), let minute = digits(2), expect(58),
            let second = digits(2)
        else { return nil }
        var millis = 0
        if i < b.count, b[i] == 46 {
            i += 1
            var count = 0
            while i < b.count, (48...57).contains(b[i]) {
                if count < 3 { millis = millis * 10 + Int(b[i] - 48) }
                count += 1
                i += 1
            }
            guard count > 0 else { return nil }
            for _ in 0..<max(0, 3 - count) { millis *= 10 }
        }
        var offsetMinutes = 0
        if expect(90, 122) {
            offsetMinutes = 0
        } else if i < b.count, b[i] == 43 || b[i] == 45 {
            let sign = b[i] == 45 ? -1 : 1
            i += 1
            guard let oh = digits(2), expect(58), let om = digits(2), oh < 24, om < 60 else { return nil }
            offsetMinutes = sign * (oh * 60 + om)
        } else {
            return nil
        }
        guard i == b.count, (1...12).contains(month), hour < 24, minute < 60, second <= 60 else { return nil }
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
        let monthDays = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard (1...monthDays[month - 1]).contains(day) else { return nil }
        let local = Timestamp.epochMs(year: year, month: month, day: day, hour: hour, minute: minute, second: min(second, 59))
        return local - Int64(offsetMinutes) * 60_000 + Int64(millis)
    }
}
