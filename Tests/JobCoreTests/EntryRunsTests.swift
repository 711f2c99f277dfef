import Threads
import XCTest

@testable import JobCore

/// A list's entries written in runs at once (`EntryRuns`): the same bytes as the list written whole, whatever the
/// runs and the entries.
final class EntryRunsTests: XCTestCase {
    private func written(_ text: StoredResultText) throws -> [UInt8] {
        var sink = AnswerSink(capacity: text.capacityBytes)
        try text.write(to: &sink)
        return try sink.finish().allBytes()
    }

    func testTheRunsTogetherAreTheListWrittenWhole() throws {
        let long = JSONValue.string(String(repeating: "x", count: 300))
        let kinds: [JSONValue] = [
            .null, .bool(false), .number("12.5"), .string("a \"quoted\"\n\u{1}é\\"), .array([]),
            .object([JSONMember("k", .array([long, .object([])]))]), long,
        ]
        for count in [2, 3, 7, 64, 1_000] {
            for runs in [2, 3, 8] where runs <= count {
                // Entries of every size, the long ones first in some runs and not in others; entries alike, which
                // fit the room the first one's length gives a run; and alike but for a longer last one, which does not.
                let mixed = (0..<count).map { kinds[($0 * 5) % kinds.count] }
                let alike = [JSONValue](
                    repeating: .object([
                        JSONMember("k", long), JSONMember("n", 1), JSONMember("t", true), JSONMember("q", "a\"b"),
                    ]), count: count)
                let longerLast = Array(alike.dropLast()) + [.array([long, long])]
                for (name, entries) in [("mixed", mixed), ("alike", alike), ("longer last", longerLast)] {
                    let text = try XCTUnwrap(
                        EntryRuns.resultText(entries, runs: runs, minimumEntries: 0, nice: currentThreadNice()))
                    let bytes = try written(text)
                    XCTAssertEqual(
                        String(decoding: bytes, as: UTF8.self), JSONValue.array(entries).text,
                        "\(count) \(name) entries in \(runs) runs")
                    XCTAssertEqual(text.capacityBytes, bytes.count)
                }
            }
        }
    }

    func testFewEntriesOrOneRunAreLeftToOneThread() {
        let entries = [JSONValue](repeating: .null, count: 10)
        let nice = currentThreadNice()
        XCTAssertNil(EntryRuns.resultText(entries, runs: 1, minimumEntries: 0, nice: nice))
        XCTAssertNil(EntryRuns.resultText(entries, runs: 2, minimumEntries: 11, nice: nice))
        XCTAssertNil(EntryRuns.resultText(Array(entries.prefix(2)), runs: 3, minimumEntries: 0, nice: nice))
        XCTAssertNotNil(EntryRuns.resultText(entries, runs: 2, minimumEntries: 10, nice: nice))
        XCTAssertNotNil(EntryRuns.resultText(Array(entries.prefix(3)), runs: 3, minimumEntries: 0, nice: nice))
    }
}
