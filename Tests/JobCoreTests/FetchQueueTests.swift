import XCTest
@testable import JobCore

/// The shared fetch queue on its own: limits, turns between jobs and hosts, dropping a job.
final class FetchQueueTests: XCTestCase {
    private func ticket(_ job: String, _ node: Int) -> FetchQueue.Ticket { FetchQueue.Ticket(jobID: job, node: node) }

    private func drain(_ queue: inout FetchQueue) -> [String] {
        var taken: [String] = []
        for _ in 0..<1_000 {
            guard let (t, host) = queue.next() else { break }
            taken.append("\(t.jobID).\(t.node)@\(host)")
        }
        return taken
    }

    func testJobsOnOneHostTakeTurns() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 100)
        for n in 0..<3 { queue.enqueue(ticket("a", n), host: "h") }
        for n in 0..<2 { queue.enqueue(ticket("b", n), host: "h") }
        XCTAssertEqual(queue.waiting, 5)
        XCTAssertEqual(drain(&queue), ["a.0@h", "b.0@h", "a.1@h", "b.1@h", "a.2@h"])
        XCTAssertEqual(queue.waiting, 0)
        XCTAssertEqual(queue.inFlight, 5)
    }

    func testAHostAtItsLimitDoesNotHoldUpAnother() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 2)
        for job in 0..<50 { queue.enqueue(ticket("j\(job)", 0), host: "busy") }
        queue.enqueue(ticket("x", 0), host: "free")
        queue.enqueue(ticket("x", 1), host: "free")
        let taken = drain(&queue)
        XCTAssertEqual(taken.filter { $0.hasSuffix("@busy") }.count, 2, "the per-host limit")
        XCTAssertEqual(taken.filter { $0.hasSuffix("@free") }, ["x.0@free", "x.1@free"])
        XCTAssertNil(queue.next())
        queue.finished(host: "busy")
        XCTAssertEqual(queue.next()?.1, "busy", "a slot given back is taken by the next waiting fetch")
        XCTAssertEqual(queue.waiting, 47)
    }

    func testTheTotalLimitHolds() {
        var queue = FetchQueue(maxTotal: 3, maxPerHost: 10)
        for n in 0..<5 { queue.enqueue(ticket("a", n), host: "h\(n)") }
        XCTAssertEqual(drain(&queue).count, 3)
        queue.finished(host: "h0")
        XCTAssertEqual(drain(&queue).count, 1)
        XCTAssertEqual(queue.inFlight, 3)
    }

    func testADroppedJobLeavesNothingBehind() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 100)
        for n in 0..<4 {
            queue.enqueue(ticket("a", n), host: "h")
            queue.enqueue(ticket("b", n), host: "h")
            queue.enqueue(ticket("a", 10 + n), host: "g")
        }
        _ = queue.next()
        queue.removeJob("a")
        XCTAssertEqual(queue.waiting, 4)
        XCTAssertEqual(Set(drain(&queue).map { $0.prefix(1) }), ["b"])
        queue.removeJob("b")
        XCTAssertEqual(queue.waiting, 0)
    }
}
