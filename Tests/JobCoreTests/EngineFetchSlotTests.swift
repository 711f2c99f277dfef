import Foundation
import Threads
import XCTest
@testable import JobCore

/// How the engine's queue hands the slots of ended fetches out again (`Engine.fetchEnded`, `pumpFetchesMidTurn`).
final class EngineFetchSlotTests: EngineTestCase {
    /// In the middle of a long turn (a large list starting its children), the slots of fetches that ended meanwhile
    /// are given back, so the pump can fill them; their outcomes are still taken in after the turn, in the order the
    /// fetches ended, and before any that ended later.
    func testAMidTurnPumpGivesBackTheSlotsOfEndedFetchesAndTakesTheirOutcomesInAfterTheTurnInOrder() throws {
        let engine = try makeEngine()
        let order = Locked<[Int]>([])
        let host = "http://127.0.0.1:9"
        let (inFlightBefore, inFlightAfter, takenInMidTurn) = engine.queue.sync { () -> (Int, Int, [Int]) in
            // A slot taken, as a fetch that began holds one; no run owns the ticket, so a pump begins nothing.
            engine.fetchQueue.enqueue(FetchQueue.Ticket(jobID: "none", node: 1), host: host)
            _ = engine.fetchQueue.next()
            let before = engine.fetchQueue.inFlight
            engine.fetchEnded(slotOf: host) { order.withLock { $0.append(1) } }
            engine.fetchEnded(slotOf: nil) { order.withLock { $0.append(2) } }
            engine.pumpFetchesMidTurn()
            engine.fetchEnded(slotOf: nil) { order.withLock { $0.append(3) } }
            return (before, engine.fetchQueue.inFlight, order.withLock { $0 })
        }
        XCTAssertEqual(inFlightBefore, 1)
        XCTAssertEqual(inFlightAfter, 0, "the ended fetch's slot is given back in the turn")
        XCTAssertEqual(takenInMidTurn, [], "no outcome is taken in during the turn")
        // The turns `fetchEnded` queued run next, in order.
        engine.queue.sync {}
        engine.queue.sync {}
        XCTAssertEqual(order.withLock { $0 }, [1, 2, 3])
    }
}
