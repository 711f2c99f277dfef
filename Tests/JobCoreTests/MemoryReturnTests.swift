import XCTest

@testable import JobCore

final class MemoryReturnTests: XCTestCase {
    private let quiet: UInt64 = 1_000

    func testTheTrimComesOnceMemoryWasLastFreedLongEnoughAgo() {
        var policy = TrimPolicy(quietNs: quiet)
        XCTAssertEqual(policy.freed(at: 100), .check(afterNs: quiet))
        XCTAssertEqual(policy.freed(at: 600), .nothing, "a check is scheduled already")
        XCTAssertEqual(policy.check(at: 1_100), .check(afterNs: 500), "freed again since: quiet for 500 only")
        XCTAssertEqual(policy.check(at: 1_600), .trim)
        XCTAssertFalse(policy.scheduled)
        XCTAssertEqual(policy.check(at: 5_000), .nothing, "nothing freed since the trim")
        // Freed again later: a new check, and a new trim.
        XCTAssertEqual(policy.freed(at: 6_000), .check(afterNs: quiet))
        XCTAssertEqual(policy.check(at: 7_000), .trim)
    }

    func testALargeRunRunningHoldsTheTrimBackUntilItLeaves() {
        var policy = TrimPolicy(quietNs: quiet)
        policy.largeRuns.insert("a")
        XCTAssertEqual(policy.freed(at: 0), .check(afterNs: quiet))
        XCTAssertEqual(policy.check(at: 5_000), .nothing, "a large run may take the pages up")
        XCTAssertFalse(policy.scheduled)
        XCTAssertEqual(policy.freedAt, 0, "what was freed is still to give back")
        // The run leaves: its leaving frees memory, and the trim follows the quiet time after it.
        policy.largeRuns.remove("a")
        XCTAssertEqual(policy.freed(at: 6_000), .check(afterNs: quiet))
        XCTAssertEqual(policy.check(at: 7_000), .trim)
    }

    func testAsksMadeBeforeTheTrimRunsAreOneTrim() {
        let memory = MemoryReturn()
        memory.quietMs = 0
        memory.queue.suspend()
        memory.bulkFreed()
        memory.bulkFreed()
        memory.bulkFreed()
        XCTAssertTrue(memory.isPending)
        XCTAssertEqual(memory.asked, 3)
        memory.queue.resume()
        XCTAssertTrue(memory.waitFor(trims: 1, milliseconds: 10_000))
        XCTAssertEqual(memory.trims, 1, "three asks before the trim runs are one")
        XCTAssertFalse(memory.isPending, "no other trim is asked for")
        // Asked for again once it has run: a second trim.
        memory.bulkFreed()
        XCTAssertTrue(memory.waitFor(trims: 2, milliseconds: 10_000))
    }

    func testALargeRunThatBeganHoldsTheTrimBack() {
        let memory = MemoryReturn()
        memory.quietMs = 0
        memory.runBegan("small", nodes: MemoryReturn.defaultMinNodes - 1)
        memory.runBegan("large", nodes: MemoryReturn.defaultMinNodes)
        memory.bulkFreed()
        XCTAssertTrue(memory.waitFor(checks: 1, milliseconds: 10_000))
        XCTAssertEqual(memory.trims, 0, "the large run is running")
        XCTAssertFalse(memory.isPending)
        memory.runEnded("large")
        memory.runsLeft(nodes: MemoryReturn.defaultMinNodes)
        XCTAssertTrue(memory.waitFor(trims: 1, milliseconds: 10_000), "the large run left")
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

    func testRunsLeavingWhileJobsWaitForRoomTrimAtOnceOnceTheyHeldEnoughNodes() {
        let memory = MemoryReturn()
        memory.roomTrimNodes = 100
        memory.quietMs = 60_000
        // Without jobs waiting, runs leaving only ask for the trim after the quiet time.
        memory.runsLeft(nodes: 500)
        memory.queue.sync {}
        XCTAssertEqual(memory.trims, 0)
        // With jobs waiting, runs of 60 and 40 nodes (100 in all) leaving trim at once, before the quiet time.
        memory.runsLeft(nodes: 60, jobsWaitForRoom: true)
        memory.queue.sync {}
        XCTAssertEqual(memory.trims, 0, "60 of 100 nodes")
        memory.runsLeft(nodes: 40, jobsWaitForRoom: true)
        XCTAssertTrue(memory.waitFor(trims: 1, milliseconds: 10_000))
        // The count starts again after the trim.
        memory.runsLeft(nodes: 99, jobsWaitForRoom: true)
        memory.queue.sync {}
        XCTAssertEqual(memory.trims, 1)
    }
}
