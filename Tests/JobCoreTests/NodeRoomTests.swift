import XCTest

@testable import JobCore

/// `NodeRoom`, the count behind `--max-active-nodes`, as a value: the engine's use of it is in ScheduleTests.
final class NodeRoomTests: XCTestCase {
    func testAJobFitsWithinTheBoundOrAloneAndNewJobsQueueBehindOneThatWaits() {
        let room = NodeRoom(budget: 10)
        XCTAssertTrue(room.take(forNew: 6))
        XCTAssertTrue(room.take(forNew: 4))
        XCTAssertEqual(room.free, 0)
        XCTAssertFalse(room.take(forNew: 1), "over the bound")
        XCTAssertTrue(room.give(10), "a job waits: the timekeeper is to look")
        // The bound is free again, but a job waits in the store: a new one goes behind it.
        XCTAssertFalse(room.take(forNew: 1))
        // The first waiting job, larger than the whole bound, runs alone.
        XCTAssertTrue(room.take(forWaiting: 25))
        XCTAssertFalse(room.take(forWaiting: 1), "nothing runs beside a job larger than the bound")
        XCTAssertTrue(room.give(25))
        XCTAssertTrue(room.take(forWaiting: 1))
        XCTAssertEqual(room.held, 1)
    }

    func testTheQueueEndsOnlyAfterAReadThatBeganWithNoJobOnItsWayToTheStore() {
        let room = NodeRoom(budget: 2)
        XCTAssertTrue(room.take(forNew: 2))
        XCTAssertFalse(room.take(forNew: 1))
        // A read begun before the waiting job's row is committed could miss it: it ends nothing.
        let early = room.markBeforeRead()
        XCTAssertNil(early)
        room.noneQueued(since: early)
        XCTAssertTrue(room.give(2), "no longer queued after a read that could not see the waiting job")
        XCTAssertFalse(room.take(forNew: 1), "a new job passed the one on its way to the store")
        room.arrived()
        room.arrived()
        // A read begun once both rows were committed, with another job sent meanwhile: still queued.
        let mark = room.markBeforeRead()
        XCTAssertNotNil(mark)
        XCTAssertFalse(room.take(forNew: 1))
        room.arrived()
        room.noneQueued(since: mark)
        XCTAssertFalse(room.take(forNew: 1), "a read ended the queue though a job was sent during it")
        room.arrived()
        // A read that began with none on its way and none sent since found none waiting: new jobs start again.
        room.noneQueued(since: room.markBeforeRead())
        XCTAssertTrue(room.take(forNew: 1))
    }

    func testWithoutABoundEveryJobFitsAndIsCounted() {
        let room = NodeRoom(budget: 0)
        XCTAssertTrue(room.take(forNew: 1_000_000))
        XCTAssertTrue(room.take(forNew: 1_000_000))
        XCTAssertEqual(room.free, Int.max)
        XCTAssertEqual(room.held, 2_000_000)
        XCTAssertFalse(room.give(2_000_000))
    }
}
