import Foundation
@testable import JobCore
import Threads
import XCTest

/// `LineWriter` on a real pipe, and the timestamps every log line starts with.
final class LoggerTests: XCTestCase {
    /// A pipe: (read end, write end), both closed when the test ends.
    private func makePipe() throws -> (Int32, Int32) {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw XCTSkip("pipe failed: errno \(errno)") }
        addTeardownBlock {
            close(ends[0])
            close(ends[1])
        }
        return (ends[0], ends[1])
    }

    /// Reads from `fd` until `count` bytes came (the test fails if the pipe ends first).
    private func read(_ fd: Int32, count: Int) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while out.count < count {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, min($0.count, count - out.count)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                XCTFail("the pipe ended after \(out.count) of \(count) bytes")
                break
            }
            out.append(contentsOf: chunk[0..<n])
        }
        return out
    }

    /// What is in the pipe now, without waiting.
    private func readAvailable(_ fd: Int32) -> String {
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        defer { _ = fcntl(fd, F_SETFL, flags) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            out.append(contentsOf: chunk[0..<n])
        }
        return String(decoding: out, as: UTF8.self)
    }

    func testLinesFromManyThreadsArriveWholeAndEachThreadsInItsOrder() throws {
        let (readEnd, writeEnd) = try makePipe()
        let writer = LineWriter(fd: writeEnd)
        let threads = 4
        let perThread = 2_000
        var lines: [[[UInt8]]] = []
        for t in 0..<threads { lines.append((0..<perThread).map { Array("thread \(t) line \($0)\n".utf8) }) }
        let total = lines.joined().reduce(0) { $0 + $1.count }
        // More than a pipe holds (64 KiB): the test reads while they write.
        XCTAssertGreaterThan(total, 65_536)
        let started = try (0..<threads).map { t in
            try startThread(name: "log-test-\(t)") { [lines] in
                for line in lines[t] { writer.write(line) }
            }
        }
        let text = String(decoding: read(readEnd, count: total), as: UTF8.self)
        for thread in started { XCTAssertEqual(pthread_join(thread, nil), 0) }

        var next = [Int](repeating: 0, count: threads)
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).dropLast() {
            let words = line.split(separator: " ")
            guard words.count == 4, let t = Int(words[1]), let k = Int(words[3]), t < threads else {
                return XCTFail("not a whole line: \(line)")
            }
            XCTAssertEqual(k, next[t], "thread \(t)'s lines out of order")
            next[t] = k + 1
        }
        XCTAssertEqual(next, [Int](repeating: perThread, count: threads))
        XCTAssertTrue(text.hasSuffix("\n"))
    }

    func testALineWaitedForIsWrittenWithEveryLineBeforeItWhenTheCallReturns() throws {
        let (readEnd, writeEnd) = try makePipe()
        let writer = LineWriter(fd: writeEnd)
        for k in 0..<100 { writer.write(Array("info \(k)\n".utf8)) }
        writer.write(Array("error\n".utf8), waitUntilWritten: true)
        let text = readAvailable(readEnd)
        XCTAssertEqual(text, (0..<100).map { "info \($0)\n" }.joined() + "error\n")
    }

    /// Logging takes no lock: a line is queued, and the caller goes on, while another thread holds the writer's
    /// lock (as a preempted thread may, in the middle of its turn).
    func testALineIsQueuedWhileAnotherThreadHoldsTheWritersLock() throws {
        let (readEnd, writeEnd) = try makePipe()
        let writer = LineWriter(fd: writeEnd)
        let queued = Watched(false)
        var logger: pthread_t?
        writer.whileLocked {
            logger = try? startThread(name: "log-test-held") {
                writer.write(Array("while held\n".utf8))
                queued.withLock { $0 = true }
            }
            XCTAssertTrue(queued.wait(milliseconds: 60_000) { $0 }, "the caller waited for the writer's lock")
        }
        let thread = try XCTUnwrap(logger)
        XCTAssertEqual(pthread_join(thread, nil), 0)
        writer.flush(waitingAtMostMs: 60_000)
        XCTAssertEqual(readAvailable(readEnd), "while held\n")
    }

    /// The writer takes the stack once for each `flush` made with nothing queued, and never for a caller already
    /// answered: going round while such a caller was on its way out, it took and wrote nothing, over and over.
    func testTheWriterTakesTheStackOnlyForWhatItsCallersWaitFor() throws {
        let (readEnd, writeEnd) = try makePipe()
        let writer = LineWriter(fd: writeEnd)
        let callers = try (0..<4).map { t in
            try startThread(name: "log-test-wait-\(t)") {
                for k in 0..<200 { writer.write(Array("t\(t) \(k)\n".utf8), waitUntilWritten: true) }
            }
        }
        for caller in callers { XCTAssertEqual(pthread_join(caller, nil), 0) }
        XCTAssertEqual(writer.takesWithoutLines, 0)
        for _ in 0..<50 { writer.flush(waitingAtMostMs: 60_000) }
        XCTAssertEqual(writer.takesWithoutLines, 50)
        XCTAssertEqual(readAvailable(readEnd).split(separator: "\n").count, 800)
    }

    func testFlushWritesEverythingQueued() throws {
        let (readEnd, writeEnd) = try makePipe()
        let writer = LineWriter(fd: writeEnd)
        for k in 0..<1_000 { writer.write(Array("line \(k)\n".utf8)) }
        writer.flush(waitingAtMostMs: 60_000)
        XCTAssertEqual(readAvailable(readEnd), (0..<1_000).map { "line \($0)\n" }.joined())
    }

    /// A reader that stops reading: the writer's `write(2)` blocks on the full pipe, the queue fills to its bound,
    /// and the callers wait for room instead of growing it; once the reader reads again, every line arrives.
    func testCallersWaitForRoomWhileNothingReadsAndNoLineIsLost() throws {
        let (readEnd, writeEnd) = try makePipe()
        let waited = Watched(0)
        let bound = 4_096
        let writer = LineWriter(fd: writeEnd, maxQueuedBytes: bound) { waited.withLock { $0 += 1 } }
        let lines = (0..<20_000).map { Array("line \($0)\n".utf8) }
        let total = lines.reduce(0) { $0 + $1.count }
        let appender = try startThread(name: "log-test-room") {
            for line in lines { writer.write(line) }
        }
        // Nothing is read until a caller waits for room: the pipe (64 KiB) and the queue (4 KiB) are full by then.
        XCTAssertTrue(waited.wait(milliseconds: 60_000) { $0 > 0 }, "no caller ever waited for room")
        let text = String(decoding: read(readEnd, count: total), as: UTF8.self)
        XCTAssertEqual(pthread_join(appender, nil), 0)
        XCTAssertEqual(text, lines.map { String(decoding: $0, as: UTF8.self) }.joined())
    }

    /// A line is the JSON object of its parts, in order, every string escaped, and a newline: read back, it is the
    /// object made of them. The message with many escapes is longer than the size guessed from its unescaped
    /// length, so its line is written a second time at the size the first pass counted.
    func testALineIsTheObjectOfItsPartsInOrderWithEveryStringEscaped() throws {
        let lines = Watched<[[UInt8]]>([])
        let logger = Logger(label: "lab\"el", minimumLevel: .debug) { line in lines.withLock { $0.append(line) } }
        let fields: KeyValuePairs<String, JSONValue> = [
            "n": .int(3), "quoted \"key\"": .string("tab\t, nul \u{0}, é, 😀"),
            "nested": .object([JSONMember("list", .array([.null, .bool(true), .double(1.5)]))]),
        ]
        let messages = ["plain", "say \"hi\"\nand\\go", String(repeating: "\u{1}", count: 300)]
        let levels: [Logger.Level] = [.debug, .info, .warning, .error]
        for (k, message) in messages.enumerated() { logger.log(levels[k + 1], message, fields) }
        logger.log(.debug, "no fields", [:])
        let written = lines.withLock { $0 }
        XCTAssertEqual(written.count, 4)
        for (k, line) in written.enumerated() {
            XCTAssertEqual(line.last, 0x0A, "line \(k) ends with its newline")
            XCTAssertEqual(line.filter { $0 == 0x0A }.count, 1, "line \(k) is one line")
            guard case .object(let members) = try JSONValue.parse(line.dropLast()) else { return XCTFail("line \(k) is no object") }
            guard members.count >= 4, case .string(let ts) = members[0].value else { return XCTFail("line \(k): \(members)") }
            XCTAssertEqual(members[0].key, "ts")
            XCTAssertEqual(ts.count, 24, ts)
            let digits = ts.split { "-T:.Z".contains($0) }.compactMap { Int($0) }
            guard digits.count == 7 else { return XCTFail("line \(k): timestamp \(ts)") }
            let ms = Timestamp.epochMs(
                year: digits[0], month: digits[1], day: digits[2], hour: digits[3], minute: digits[4], second: digits[5])
            XCTAssertEqual(Timestamp.format(ms + Int64(digits[6])), ts)
            let level = k < 3 ? levels[k + 1] : .debug
            var expected = [
                JSONMember("level", .string("\(level.name)")), JSONMember("logger", .string("lab\"el")),
                JSONMember("msg", .string(k < 3 ? messages[k] : "no fields")),
            ]
            if k < 3 { for (key, value) in fields { expected.append(JSONMember(key, value)) } }
            XCTAssertEqual(Array(members.dropFirst()), expected, "line \(k)")
        }
    }

    /// The timestamp a line starts with is `format`'s text as a JSON string, whether its digits are written in place
    /// (1970 to the year 9999) or come from `gmtime_r`.
    func testATimestampWrittenQuotedIsTheFormattedTextAsAJSONString() {
        for ms: Int64 in [0, 1_798_798_288_123, 253_402_300_799_999, 253_402_300_800_000, -1_000] {
            let written = ByteSink.bytes(unescapedCount: 26) { Timestamp.writeQuoted(ms, to: &$0) }
            XCTAssertEqual(written, JSONValue.string(Timestamp.format(ms)).bytes, "\(ms)")
        }
    }

    func testTimestampsAreRFC3339InUTCWithMilliseconds() {
        let table: [(Int64, String)] = [
            (0, "1970-01-01T00:00:00.000Z"),
            (1, "1970-01-01T00:00:00.001Z"),
            (86_399_999, "1970-01-01T23:59:59.999Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (951_868_800_000, "2000-03-01T00:00:00.000Z"),
            (1_798_798_288_123, "2027-01-01T10:11:28.123Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
            (253_402_300_800_000, "10000-01-01T00:00:00.000Z"),
            (-1_000, "1969-12-31T23:59:59.000Z"),
        ]
        for (ms, text) in table { XCTAssertEqual(Timestamp.format(ms), text, "\(ms)") }
    }

    /// The digit-by-digit form and `gmtime_r`'s agree across the whole range, and each reads back as its instant.
    func testTimestampsAgreeWithGmtimeAndReadBack() {
        var generator = SystemRandomNumberGenerator()
        var instants: [Int64] = (0..<20_000).map { _ in Int64.random(in: 0..<253_402_300_800_000, using: &generator) }
        // Every day of a leap century's turn, at its last millisecond.
        instants += (0..<1_500).map { 946_684_800_000 - 400 * 86_400_000 + Int64($0) * 86_400_000 - 1 }
        for ms in instants {
            let text = Timestamp.format(ms)
            XCTAssertEqual(text, Timestamp.formatAnyYear(ms), "\(ms)")
            let digits = text.split { "-T:.Z".contains($0) }.compactMap { Int($0) }
            guard digits.count == 7 else { return XCTFail("unexpected form \(text)") }
            let back = Timestamp.epochMs(
                year: digits[0], month: digits[1], day: digits[2], hour: digits[3], minute: digits[4], second: digits[5])
            XCTAssertEqual(back + Int64(digits[6]), ms, text)
        }
    }
}
