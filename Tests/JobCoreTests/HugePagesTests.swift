import Foundation
import XCTest

@testable import JobCore

final class HugePagesTests: XCTestCase {
    /// The flags (`VmFlags` of /proc/self/smaps) of the mapping that holds `address`.
    private func mappingFlags(at address: Int) throws -> [Substring] {
        // Read to its end: the file's size says 0.
        let file = try XCTUnwrap(FileHandle(forReadingAtPath: "/proc/self/smaps"))
        defer { try? file.close() }
        let smaps = String(decoding: try XCTUnwrap(file.readToEnd()), as: UTF8.self)
        var inside = false
        for line in smaps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            if let range = fields.first, let dash = range.firstIndex(of: "-"),
               let low = Int(range[..<dash], radix: 16), let high = Int(range[range.index(after: dash)...], radix: 16) {
                inside = low <= address && address < high
            } else if inside, fields.first == "VmFlags:" {
                return Array(fields.dropFirst())
            }
        }
        XCTFail("no mapping holds \(address)")
        return []
    }

    func testALargeAnswerIsWrittenIntoMemoryAdvisedForHugePages() throws {
        try XCTSkipUnless(
            FileManager.default.fileExists(atPath: "/sys/kernel/mm/transparent_hugepage/enabled"),
            "this kernel has no transparent huge pages")
        let line = JSONValue.string(String(repeating: "x", count: 1_000))
        let large = JSONValue.array(Array(repeating: line, count: 2 * HugePages.minBytes / 1_000)).bytes
        // The middle of a buffer of twice the threshold lies in a whole advised 2 MiB page.
        let middle = large.withUnsafeBufferPointer { Int(bitPattern: $0.baseAddress) + $0.count / 2 }
        XCTAssertTrue(try mappingFlags(at: middle).contains("hg"), "advised for huge pages")
        XCTAssertEqual(large.count, 2 * HugePages.minBytes / 1_000 * 1_003 + 1)
    }
}
