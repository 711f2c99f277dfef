import XCTest

@testable import JobCore

final class MemoryReturnTests: XCTestCase {
    func testAsksMadeBeforeTheTrimRunsAreOneTrim() {
        let memory = MemoryReturn()
        memory.queue.suspend()
        memory.bulkFreed()
        memory.bulkFreed()
        memory.bulkFreed()
        XCTAssertTrue(memory.isPending)
        XCTAssertEqual(memory.asked, 1, "three asks before the trim runs are one")
        memory.queue.resume()
        XCTAssertTrue(memory.waitForTrims(1, milliseconds: 10_000))
        XCTAssertFalse(memory.isPending, "no other trim is asked for")
        // Asked for again once it has run: a second trim.
        memory.bulkFreed()
        XCTAssertEqual(memory.asked, 2)
        XCTAssertTrue(memory.waitForTrims(2, milliseconds: 10_000))
    }

    func testOnlyLargeRunsAndAnswersAskForATrim() {
        let memory = MemoryReturn()
        memory.queue.suspend()
        defer { memory.queue.resume() }
        memory.runsLeft(nodes: MemoryReturn.defaultMinNodes - 1)
        memory.answerMade(bytes: MemoryReturn.defaultMinAnswerBytes - 1)
        XCTAssertFalse(memory.isPending)
        memory.runsLeft(nodes: MemoryReturn.defaultMinNodes)
        XCTAssertTrue(memory.isPending, "a large run")

        let reads = MemoryReturn()
        reads.queue.suspend()
        defer { reads.queue.resume() }
        reads.answerMade(bytes: MemoryReturn.defaultMinAnswerBytes)
        XCTAssertTrue(reads.isPending, "a large answer")
    }
}
