#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Threads

/// A small structured logger: one JSON object a line, to standard error by
/// default, so a log shipper can read it. Passed in, never global.
public struct Logger: Sendable {
    /// How much to say.
    public enum Level: Int, Sendable, Comparable {
        case debug = 0, info, warning, error
        var name: StaticString {
            switch self {
            case .debug: "debug"
            case .info: "info"
            case .warning: "warning"
            case .error: "error"
            }
        }
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
    }

    public var label: String
    public var minimumLevel: Level
    private let sink: @Sendable (Level, [UInt8]) -> Void

    /// A logger writing to standard error through `LineWriter.standardError`: a warning or an error is written
    /// before `log` returns, with every line logged before it; a debug or info line is queued for the writer's
    /// thread, which writes it within moments, and at the latest when the process exits.
    public init(label: String, minimumLevel: Level = .info) {
        self.init(label: label, minimumLevel: minimumLevel, levelSink: { level, line in
            LineWriter.standardError.write(line, waitUntilWritten: level >= .warning)
        })
    }

    /// A logger writing each finished line (with its newline) to `sink`.
    public init(label: String, minimumLevel: Level = .info, sink: @escaping @Sendable ([UInt8]) -> Void) {
        self.init(label: label, minimumLevel: minimumLevel, levelSink: { _, line in sink(line) })
    }

    private init(label: String, minimumLevel: Level, levelSink: @escaping @Sendable (Level, [UInt8]) -> Void) {
        self.label = label
        self.minimumLevel = minimumLevel
        self.sink = levelSink
    }

    /// A logger that drops everything.
    public static let disabled = Logger(label: "", minimumLevel: .error) { _ in }

    public func debug(_ message: String, _ fields: KeyValuePairs<String, JSONValue> = [:]) { log(.debug, message, fields) }
    public func info(_ message: String, _ fields: KeyValuePairs<String, JSONValue> = [:]) { log(.info, message, fields) }
    public func warning(_ message: String, _ fields: KeyValuePairs<String, JSONValue> = [:]) { log(.warning, message, fields) }
    public func error(_ message: String, _ fields: KeyValuePairs<String, JSONValue> = [:]) { log(.error, message, fields) }

    /// Writes `{"ts":…,"level":…,"logger":…,"msg":…, fields…}` if `level` is enabled.
    ///
    /// The line is written straight into one buffer sized from its parts, as `JSONValue.bytes` writes a value: at the
    /// default level every request logs one. Making the object first (an array of members, the timestamp as a
    /// string, then its text) took 6.1–6.5 % of the server's CPU samples while wrk read a settled job; this takes
    /// 3.7–3.9 % (perf, two runs each).
    public func log(_ level: Level, _ message: String, _ fields: KeyValuePairs<String, JSONValue>) {
        guard level >= minimumLevel else { return }
        let ms = Timestamp.nowMs()
        var unescaped = 64 + label.utf8.count + message.utf8.count
        for (key, value) in fields { unescaped += key.utf8.count + 4 + value.unescapedByteCount }
        let line = ByteSink.bytes(unescapedCount: unescaped) { out in
            out.append("{\"ts\":")
            Timestamp.writeQuoted(ms, to: &out)
            out.append(",\"level\":\"")
            out.append(level.name)
            out.append("\",\"logger\":")
            JSONValue.writeString(label, to: &out)
            out.append(",\"msg\":")
            JSONValue.writeString(message, to: &out)
            for (key, value) in fields {
                out.append(UInt8(ascii: ","))
                JSONValue.writeString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                value.write(to: &out)
            }
            out.append("}\n")
        }
        sink(level, line)
    }
}

/// Wall-clock times as milliseconds since the Unix epoch, and their RFC 3339 form.
public enum Timestamp {
    /// Now, in milliseconds since the epoch.
    public static func nowMs() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    /// A monotonic clock in milliseconds, for measuring durations.
    public static func monotonicMs() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    /// Milliseconds since the epoch of a UTC civil date and time, with no calendar or locale involved (Howard
    /// Hinnant's days-from-civil algorithm). The fields are not checked: the callers parse and check them.
    static func epochMs(year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return (Int64(days) * 86_400 + Int64(hour * 3600 + minute * 60 + second)) * 1000
    }

    /// `2026-12-02T08:11:28.123Z`.
    ///
    /// From 1970 to the year 9999 the digits are written one by one from the civil date (Howard Hinnant's
    /// civil-from-days), other instants through `gmtime_r`: every log line has a timestamp, and `gmtime_r` takes
    /// glibc's time zone lock, which the threads that log then took in turn.
    public static func format(_ ms: Int64) -> String {
        guard ms >= 0, ms < endOfYear9999Ms else { return formatAnyYear(ms) }
        return String(unsafeUninitializedCapacity: formattedCount) { text in
            if let start = text.baseAddress { write(ms, to: start) }
            return formattedCount
        }
    }

    /// Writes `format(ms)` to `sink` as a JSON string, its digits in place (no `String` made) from 1970 to the
    /// year 9999.
    static func writeQuoted(_ ms: Int64, to sink: inout ByteSink) {
        guard ms >= 0, ms < endOfYear9999Ms else { return JSONValue.writeString(formatAnyYear(ms), to: &sink) }
        sink.append(UInt8(ascii: "\""))
        sink.append(count: formattedCount) { write(ms, to: $0) }
        sink.append(UInt8(ascii: "\""))
    }

    /// The length of `format`'s text from 1970 to the year 9999.
    private static let formattedCount = 24
    /// 10000-01-01T00:00:00Z: `write` takes instants before it (and from 1970).
    private static let endOfYear9999Ms: Int64 = 253_402_300_800_000

    /// Writes `format(ms)`, `formattedCount` bytes, from `start`; for `ms` from 0 to before `endOfYear9999Ms`.
    private static func write(_ ms: Int64, to start: UnsafeMutablePointer<UInt8>) {
        let days = ms / 86_400_000
        let msOfDay = ms % 86_400_000
        let z = days + 719_468
        let era = z / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yoe + era * 400 + (month <= 2 ? 1 : 0)
        func put(_ value: Int64, at offset: Int, width: Int) {
            var value = value
            for k in stride(from: offset + width - 1, through: offset, by: -1) {
                start[k] = UInt8(truncatingIfNeeded: 0x30 + value % 10)
                value /= 10
            }
        }
        put(year, at: 0, width: 4)
        start[4] = UInt8(ascii: "-")
        put(month, at: 5, width: 2)
        start[7] = UInt8(ascii: "-")
        put(day, at: 8, width: 2)
        start[10] = UInt8(ascii: "T")
        put(msOfDay / 3_600_000, at: 11, width: 2)
        start[13] = UInt8(ascii: ":")
        put(msOfDay / 60_000 % 60, at: 14, width: 2)
        start[16] = UInt8(ascii: ":")
        put(msOfDay / 1000 % 60, at: 17, width: 2)
        start[19] = UInt8(ascii: ".")
        put(msOfDay % 1000, at: 20, width: 3)
        start[23] = UInt8(ascii: "Z")
    }

    /// `format` for any instant, through `gmtime_r`: before 1970 and from the year 10000 on.
    static func formatAnyYear(_ ms: Int64) -> String {
        var seconds = time_t(ms / 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ v: Int32, _ width: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        let millis = Int32(ms % 1000)
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(millis, 3))Z"
    }
}
