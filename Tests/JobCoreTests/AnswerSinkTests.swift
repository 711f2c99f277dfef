import Foundation
import XCTest

@testable import JobCore

/// Where a large answer is written: memory, or a temporary file reached through a small buffer, with the same bytes.
final class AnswerSinkTests: XCTestCase {
    /// Writes the same pieces and copies to `sink`: text, then copies of earlier ranges (in the file, in the buffer,
    /// across both), flushing between pieces as writers do.
    private func write(into sink: inout AnswerSink) throws -> [UInt8] {
        var expected: [UInt8] = []
        func piece(_ text: String) throws {
            sink.append(contentsOf: text.utf8)
            expected.append(contentsOf: text.utf8)
            try sink.flushIfFull()
        }
        func copy(_ range: Range<Int>) throws {
            try sink.appendCopy(of: range)
            expected.append(contentsOf: expected[range])
            try sink.flushIfFull()
        }
        try piece("{\"nodes\":[")
        for k in 0..<50 { try piece("{\"id\":\"n\(k)\",\"result\":\(k * k)},") }
        try copy(0..<10)
        try copy(100..<400)
        try copy(expected.count - 5..<expected.count)
        try copy(3..<expected.count)
        sink.append(UInt8(ascii: "]"))
        expected.append(UInt8(ascii: "]"))
        return expected
    }

    func testInMemoryTheAnswerIsTheBytesWritten() throws {
        var sink = AnswerSink(capacity: 16)
        let expected = try write(into: &sink)
        let answer = try sink.finish()
        XCTAssertNil(answer.file)
        XCTAssertEqual(answer.bytes, expected)
        XCTAssertEqual(answer.count, expected.count)
    }

    /// Arrays given as shared are kept as they are in memory, the answer made of them and what was written between;
    /// in a file they are written as any other bytes. Copies of earlier ranges read across them.
    func testSharedArraysAreKeptAsTheyAreInMemoryAndWrittenToAFile() throws {
        let shared = (0..<3).map { k in Array(String(repeating: "\(k)", count: 100 + k).utf8) }
        func write(into sink: inout AnswerSink) throws -> [UInt8] {
            var expected = try self.write(into: &sink)
            for text in shared {
                try sink.append(shared: text)
                try sink.append(shared: [])
                expected += text
                XCTAssertEqual(sink.count, expected.count)
            }
            sink.append(contentsOf: "x".utf8)
            expected += Array("x".utf8)
            try sink.append(shared: shared[0])
            // From the bytes before the shared arrays to the x after them.
            try sink.appendCopy(of: 5..<expected.count)
            expected += shared[0] + expected[5...]
            sink.append(contentsOf: "]".utf8)
            return expected + Array("]".utf8)
        }
        var sink = AnswerSink(capacity: 1 << 20)
        let expected = try write(into: &sink)
        let answer = try sink.finish()
        XCTAssertEqual(answer.count, expected.count)
        XCTAssertTrue(try answer.allBytes() == expected)
        XCTAssertEqual(answer.pieces.count, 6, "before, the three, an x, the first again, the rest")
        XCTAssertLessThan(answer.bytes.capacity, 4096 + 2 * answer.bytes.count, "the room reserved is not kept")
        for k in shared.indices {
            let kept = answer.pieces[k].withUnsafeBufferPointer { piece in
                shared[k].withUnsafeBufferPointer { $0.baseAddress == piece.baseAddress }
            }
            XCTAssertTrue(kept, "shared array \(k) was copied")
        }
        var file = try AnswerSink.spooled(in: NSTemporaryDirectory(), flushBytes: 64)
        let written = try write(into: &file)
        let spooled = try file.finish()
        XCTAssertEqual(spooled.pieces.count, 0)
        XCTAssertTrue(try XCTUnwrap(spooled.file).bytes() == written)
        XCTAssertEqual(written, expected)
    }

    func testInAFileTheAnswerIsTheSameBytesWhateverTheBufferSize() throws {
        for flushBytes in [1, 7, 64, 1 << 20] {
            var sink = try AnswerSink.spooled(in: NSTemporaryDirectory(), flushBytes: flushBytes)
            let expected = try write(into: &sink)
            XCTAssertEqual(sink.count, expected.count, "flushing every \(flushBytes)")
            let answer = try sink.finish()
            let file = try XCTUnwrap(answer.file, "flushing every \(flushBytes)")
            XCTAssertEqual(answer.bytes, [], "nothing held in memory")
            XCTAssertEqual(answer.count, expected.count)
            XCTAssertEqual(try file.bytes(), expected, "flushing every \(flushBytes)")
        }
    }

    func testTheFileHasNoNameAndClosesWithTheAnswer() throws {
        var sink = try AnswerSink.spooled(in: NSTemporaryDirectory(), flushBytes: 4)
        sink.append(contentsOf: "0123456789".utf8)
        var answer: SettledAnswer? = try sink.finish()
        let fd = try XCTUnwrap(answer?.file?.fd)
        let link = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")
        XCTAssertTrue(link.hasSuffix("(deleted)"), "\(link): nothing of the file is left on disk to clean up")
        var status = stat()
        XCTAssertEqual(fstat(fd, &status), 0)
        XCTAssertEqual(status.st_size, 10)
        answer = nil
        XCTAssertNil(answer)
        // Closed: the descriptor names nothing, or (taken again meanwhile) something else.
        let after = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")
        XCTAssertNotEqual(after, link, "closed with the last reference to the answer")
    }

    /// The answer a spool makes: its bytes, wherever they are kept.
    private func bytes(of answer: SettledAnswer) throws -> [UInt8] { try answer.file?.bytes() ?? answer.bytes }

    func testASpoolWritesALargeAnswerToAFileAndASmallOneToMemory() throws {
        let spool = AnswerSpool(directory: NSTemporaryDirectory(), thresholdBytes: 100)
        let text = Array(String(repeating: "0123456789", count: 20).utf8)
        let large = try spool.answer(estimate: 100) { $0.append(contentsOf: text) }
        XCTAssertNotNil(large.file)
        XCTAssertEqual(try bytes(of: large), text)
        let small = try spool.answer(estimate: 99) { $0.append(contentsOf: text) }
        XCTAssertNil(small.file)
        XCTAssertEqual(small.bytes, text)
    }

    func testWhereNoFileCanBeMadeTheAnswerIsMadeInMemory() throws {
        let spool = AnswerSpool(directory: "/nonexistent-\(UUID().uuidString)", thresholdBytes: 0)
        let answer = try spool.answer(estimate: 10) { $0.append(contentsOf: "0123456789".utf8) }
        XCTAssertNil(answer.file)
        XCTAssertEqual(answer.bytes, Array("0123456789".utf8))
    }

    /// A full disk, as a write past the process's file size limit fails (`EFBIG`): the answer is written again, in
    /// memory, whole.
    func testAFileWriteThatFailsMidwayLeavesTheWholeAnswerInMemory() throws {
        let text = (0..<(3 << 20)).map { UInt8(ascii: "a") + UInt8($0 % 26) }
        var limit = rlimit()
        XCTAssertEqual(getrlimit(Int32(RLIMIT_FSIZE.rawValue), &limit), 0)
        let previous = signal(SIGXFSZ, SIG_IGN)
        var lowered = limit
        lowered.rlim_cur = 1 << 20
        XCTAssertEqual(setrlimit(Int32(RLIMIT_FSIZE.rawValue), &lowered), 0)
        let answer: SettledAnswer
        do {
            defer {
                _ = setrlimit(Int32(RLIMIT_FSIZE.rawValue), &limit)
                _ = signal(SIGXFSZ, previous)
            }
            answer = try AnswerSpool(directory: NSTemporaryDirectory(), thresholdBytes: 0).answer(estimate: text.count) { out in
                for piece in stride(from: 0, to: text.count, by: 1 << 16) {
                    out.append(contentsOf: text[piece..<min(text.count, piece + (1 << 16))])
                    try out.flushIfFull()
                }
            }
        }
        XCTAssertNil(answer.file, "the file past the limit was kept")
        XCTAssertTrue(answer.bytes == text)
    }

    func testAFileThatCannotBeMadeIsAnIOError() {
        XCTAssertThrowsError(try AnswerSink.spooled(in: "/nonexistent-\(UUID().uuidString)")) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .io)
        }
    }
}
