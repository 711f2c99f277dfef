import Foundation
import Threads
import XCTest
@testable import JobCore

/// The writer's inbox: state changes nobody waits on are held for more to join them, and anything somebody waits
/// on (a creation, a flush) or closing hands the batch over at once.
final class WriteQueueTests: XCTestCase {
    static func changes(_ position: Int) -> WriteOp {
        let node = NodeRecord(jobID: "j", id: "n\(position)", parent: nil, position: position, type: "fetch", state: .running)
        return .changes(Changes(jobs: [], nodes: [node], bodies: []))
    }

    func positions(_ batch: [WriteOp]?) -> [Int] {
        (batch ?? []).compactMap { op in
            if case .changes(let changes) = op { return changes.nodes.first?.position }
            return nil
        }
    }

    /// An hour from now: longer than any test waits, so a batch that comes back came back for a reason.
    private var anHourFromNow: Int64 { Timestamp.monotonicMs() + 3_600_000 }

    /// Runs `work` on a thread of its own.
    private func inBackground(_ work: @escaping @Sendable () -> Void) {
        Thread(block: work).start()
    }

    /// Closes `queue` after 30 s unless `disarm` ran first, so that a take that would wait for the hour ends;
    /// `fired` tells whether it had to.
    private func watchdog(_ queue: WriteQueue) -> (fired: () -> Bool, disarm: () -> Void) {
        let state = Flags()
        let timer = DispatchWorkItem {
            state.fired = true
            queue.close()
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + 30, execute: timer)
        return ({ state.fired }, { timer.cancel() })
    }

    /// A new job's rows are handed to the writer urgent from `absorbedRecords` of them on, so that it takes them into
    /// its compact table at once rather than holding them queued as whole records while the job runs.
    func testANewJobsRowsAreUrgentFromAsManyAsTheWriterAbsorbs() {
        let rows = { (count: Int) in
            (0..<count).map { NodeRecord(jobID: "j", id: "n\($0)", parent: nil, position: $0, type: "fetch", state: .pending) }
        }
        let table: [(rows: Int, urgent: Bool)] = [
            (1, false),
            (WriteQueue.absorbedRecords - 1, false),
            (WriteQueue.absorbedRecords, true),
            (WriteQueue.absorbedRecords * 4, true),
        ]
        for row in table {
            let changes = Changes.unstoredRows(rows(row.rows))
            XCTAssertEqual(changes.urgent, row.urgent, "\(row.rows) rows")
            XCTAssertEqual(changes.unstoredNodes.count, row.rows)
        }
    }

    func testChangesWaitForMoreUntilAFlushHandsThemOver() {
        let queue = WriteQueue()
        XCTAssertTrue(queue.push(Self.changes(1)))
        let dog = watchdog(queue)
        inBackground {
            _ = queue.push(Self.changes(2))
            _ = queue.push(Self.changes(3))
            _ = queue.push(.committed(WriteTicket<Void>()))
        }
        let batch = queue.take(gatheringChangesUntilMs: anHourFromNow)
        dog.disarm()
        XCTAssertFalse(dog.fired(), "the flush handed the batch over")
        XCTAssertEqual(positions(batch), [1, 2, 3], "the changes queued while it waited joined the first")
        XCTAssertEqual(batch?.count, 4)
        if case .committed? = batch?.last {} else { XCTFail("the flush ends the batch: \(String(describing: batch))") }
    }

    func testACreationIsHandedOverAtOnceWithTheChangesBeforeIt() {
        let queue = WriteQueue()
        XCTAssertTrue(queue.push(Self.changes(1)))
        let job = JobRecord(id: "j", createdAt: 0, request: .null)
        XCTAssertTrue(queue.push(.create(CreateRequest(job: job, nodes: []), WriteTicket<CreateOutcome>())))
        let dog = watchdog(queue)
        let batch = queue.take(gatheringChangesUntilMs: anHourFromNow)
        dog.disarm()
        XCTAssertFalse(dog.fired(), "the creation handed the batch over")
        XCTAssertEqual(positions(batch), [1])
        XCTAssertEqual(batch?.count, 2)
    }

    func testChangesAloneAreHandedOverWhenTheirTimeComes() {
        let queue = WriteQueue()
        XCTAssertTrue(queue.push(Self.changes(1)))
        let dog = watchdog(queue)
        let batch = queue.take(gatheringChangesUntilMs: Timestamp.monotonicMs() + 20)
        dog.disarm()
        XCTAssertFalse(dog.fired())
        XCTAssertEqual(positions(batch), [1])
    }

    func testClosingHandsOverWhatWaitsAndThenNothing() {
        let queue = WriteQueue()
        XCTAssertTrue(queue.push(Self.changes(1)))
        inBackground { queue.close() }
        XCTAssertEqual(positions(queue.take(gatheringChangesUntilMs: anHourFromNow)), [1])
        XCTAssertFalse(queue.push(Self.changes(2)), "closed")
        XCTAssertNil(queue.take(gatheringChangesUntilMs: anHourFromNow), "closed and drained")
    }

    /// The test's thread, which plays the writer and goes to idle priority and back; the test is skipped where this
    /// user may not take a thread back.
    func writerThread() throws -> Int32 {
        try XCTSkipUnless(
            IdlePriority.isReversible(atNice: currentThreadNice()),
            "this user may not take a thread back from idle priority (needs CAP_SYS_NICE or ulimit -e)")
        return currentThreadID()
    }

    /// The test's thread plays the writer: `writerStarted` and `take` run on it, and the pushes on the test's thread
    /// too (a push raises the writer from any thread), so every row is a fact when the next line looks.
    func testTheWriterWritesStateChangesAloneAtIdlePriorityAndIsRaisedWhenSomebodyWaitsForUrgentChangesOrAChangeWaitedLong() throws {
        let me = try writerThread()
        defer { IdlePriority.set(false, thread: me) }
        let job = JobRecord(id: "j", createdAt: 0, request: .null)
        var settled = job
        settled.state = .succeeded
        let create: () -> WriteOp = { .create(CreateRequest(job: job, nodes: []), WriteTicket<CreateOutcome>()) }
        let rows: [(what: String, lagMs: Int64, push: () -> WriteOp, idleAfterPush: Bool, idleAfterTake: Bool)] = [
            ("a creation", 3_600_000, create, false, false),
            ("a flush", 3_600_000, { .committed(WriteTicket<Void>()) }, false, false),
            ("a job that settles", 3_600_000, { .changes(Changes(jobs: [settled], nodes: [], bodies: [])) }, false, false),
            ("urgent changes", 3_600_000, { .changes(Changes(jobs: [], nodes: [], bodies: [], urgent: true)) }, false, false),
            ("a state change once the lag is up", 0, { Self.changes(2) }, false, false),
        ]
        for row in rows {
            let queue = WriteQueue()
            queue.maxIdleLagMs = 3_600_000
            queue.writerStarted(logger: Logger(label: "test", minimumLevel: .error))
            XCTAssertFalse(IdlePriority.isIdle(thread: me), "\(row.what): not idle before any batch")
            XCTAssertTrue(queue.push(Self.changes(1)))
            XCTAssertEqual(positions(queue.take(gatheringChangesUntilMs: 0)), [1])
            XCTAssertTrue(IdlePriority.isIdle(thread: me), "\(row.what): idle for state changes alone")
            XCTAssertTrue(queue.writerAtIdlePriority)
            queue.maxIdleLagMs = row.lagMs
            XCTAssertTrue(queue.push(row.push()))
            XCTAssertEqual(IdlePriority.isIdle(thread: me), row.idleAfterPush, "\(row.what): after the push")
            XCTAssertEqual(queue.take(gatheringChangesUntilMs: 0)?.count, 1)
            XCTAssertEqual(IdlePriority.isIdle(thread: me), row.idleAfterTake, "\(row.what): writing it")
            queue.close()
            XCTAssertFalse(IdlePriority.isIdle(thread: me), "\(row.what): closing is waited on")
            XCTAssertNil(queue.take(gatheringChangesUntilMs: 0))
        }
    }
}

extension WriteQueueTests {
    /// An idle writer holds state changes alone until the first has waited the lag; a writer at its own priority
    /// gathers for the time it is given only. Each row fails if its deadline is broken.
    func testAnIdleWriterHoldsStateChangesAloneUntilTheFirstHasWaitedTheLag() {
        let rows: [(what: String, untilMs: Int64, idle: Bool, queuedSinceMs: Int64, lagMs: Int64, deadline: Int64)] = [
            ("at its own priority: the gathering time", 1_010, false, 1_000, 10_000, 1_010),
            ("idle: until the lag is up", 1_010, true, 1_000, 10_000, 11_000),
            ("idle, with no lag: the gathering time", 1_010, true, 1_000, 0, 1_010),
            ("idle, the lag up already: the gathering time", 1_010, true, 0, 500, 1_010),
        ]
        for row in rows {
            XCTAssertEqual(
                WriteQueue.gatherUntil(row.untilMs, writerIsIdle: row.idle, queuedSinceMs: row.queuedSinceMs, lagMs: row.lagMs),
                row.deadline, row.what)
        }
    }

    /// The writer's pending changes keep their tables' room after an ordinary batch, not after one of a large job.
    func testPendingChangesLetGoOfTheRoomALargeBatchMade() {
        func nodes(_ count: Int) -> Changes {
            Changes(jobs: [], nodes: (0..<count).map {
                NodeRecord(jobID: "j", id: "n\($0)", parent: nil, position: $0, type: "fetch", state: .running)
            }, bodies: [])
        }
        var pending = PendingChanges()
        pending.merge(nodes(100))
        pending.removeAll()
        XCTAssertGreaterThanOrEqual(pending.nodes.capacity, 100, "room kept for the next batch")
        pending.merge(nodes(PendingChanges.keptCapacity * 2))
        pending.removeAll()
        XCTAssertLessThanOrEqual(pending.nodes.capacity, PendingChanges.keptCapacity, "a large batch's room let go")
        XCTAssertTrue(pending.isEmpty)
    }

    /// The writers take node and body changes in their rows' key order (job, then position or node id), whatever
    /// order they came in.
    func testPendingChangesAreTakenInTheirRowsKeyOrder() {
        var positions = Array(0..<300)
        positions.shuffle()
        let jobs = ["J2", "J1", "J10"]
        var pending = PendingChanges()
        pending.merge(Changes(
            jobs: [],
            nodes: positions.flatMap { p in
                jobs.map { NodeRecord(jobID: $0, id: "n\(p)", parent: nil, position: p, type: "fetch", state: .running) }
            },
            bodies: positions.flatMap { p in
                jobs.map { (jobID: $0, nodeID: "n\(p)", body: StoredBody(contentType: nil, bytes: [UInt8(p & 0xFF)])) }
            }))
        let nodeKeys = pending.nodesInRowOrder.map { pending.nodes[$0].key }
        XCTAssertEqual(nodeKeys.map(\.jobID), ["J1", "J10", "J2"].flatMap { Array(repeating: $0, count: 300) })
        XCTAssertEqual(nodeKeys.map(\.position), Array((0..<3).map { _ in Array(0..<300) }.joined()))
        let bodyKeys = pending.bodiesInRowOrder.map { pending.bodies[$0].key }
        XCTAssertEqual(bodyKeys.count, 900)
        XCTAssertEqual(bodyKeys.map(\.jobID), nodeKeys.map(\.jobID))
        XCTAssertEqual(bodyKeys.map(\.nodeID), ["J1", "J10", "J2"].flatMap { _ in (0..<300).map { "n\($0)" }.sorted() })
    }

    /// State changes held by an idle writer are written with what raises it: here urgent changes pushed after them.
    func testStateChangesHeldByAnIdleWriterGoWithTheUrgentChangesThatRaiseIt() throws {
        let me = try writerThread()
        defer { IdlePriority.set(false, thread: me) }
        let queue = WriteQueue()
        queue.maxIdleLagMs = 3_600_000
        queue.writerStarted(logger: Logger(label: "test", minimumLevel: .error))
        XCTAssertTrue(queue.push(Self.changes(1)))
        XCTAssertEqual(positions(queue.take(gatheringChangesUntilMs: 0)), [1])
        XCTAssertTrue(queue.writerAtIdlePriority)
        XCTAssertTrue(queue.push(Self.changes(2)))
        XCTAssertTrue(queue.writerAtIdlePriority, "a state change alone is held, the writer left idle")
        XCTAssertTrue(queue.push(.changes(Changes(jobs: [], nodes: [], bodies: [], urgent: true))))
        XCTAssertFalse(queue.writerAtIdlePriority, "urgent changes raise it")
        XCTAssertEqual(queue.take(gatheringChangesUntilMs: 0)?.count, 2, "the held change goes with them")
        queue.close()
    }
}

extension WriteQueueTests {
    /// State changes of `count` nodes in one op.
    static func manyChanges(_ count: Int) -> WriteOp {
        .changes(Changes(jobs: [], nodes: (0..<count).map {
            NodeRecord(jobID: "j", id: "n\($0)", parent: nil, position: $0, type: "fetch", state: .running)
        }, bodies: []))
    }

    /// While the writer gathers, state changes past `absorbedRecords` records go to it to be merged, not held in
    /// the queue; the batch that ends the gathering carries only what came after.
    func testChangesGatheredPastTheBoundGoToTheWriterWhileItWaits() {
        let queue = WriteQueue()
        XCTAssertTrue(queue.push(Self.manyChanges(WriteQueue.absorbedRecords)))
        var absorbed: [Int] = []
        let batch = queue.take(gatheringChangesUntilMs: anHourFromNow) { changes in
            absorbed += changes.flatMap { $0.nodes.map(\.position) }
            // What ends the gathering comes while the writer merges.
            _ = queue.push(.committed(WriteTicket<Void>()))
        }
        XCTAssertEqual(absorbed, Array(0..<WriteQueue.absorbedRecords), "every change went to the writer, in order")
        XCTAssertEqual(batch?.count, 1)
        if case .committed? = batch?.first {} else { XCTFail("only the flush is left: \(String(describing: batch))") }
        queue.close()
    }

    /// Fewer records than the bound stay queued; a batch comes even when every change went to the writer, so that
    /// what it merged is written, and closing ends the queue after it.
    func testChangesMergedWhileGatheringAreWrittenWithABatchEvenAnEmptyOne() {
        let queue = WriteQueue()
        XCTAssertTrue(queue.push(Self.manyChanges(WriteQueue.absorbedRecords - 1)))
        XCTAssertEqual(queue.take(gatheringChangesUntilMs: 0) { _ in XCTFail("under the bound nothing is merged early") }?.count, 1)
        XCTAssertTrue(queue.push(Self.manyChanges(WriteQueue.absorbedRecords + 1)))
        var merged = 0
        let batch = queue.take(gatheringChangesUntilMs: anHourFromNow) { changes in
            merged += changes.reduce(0) { $0 + $1.count }
            queue.close()
        }
        XCTAssertEqual(merged, WriteQueue.absorbedRecords + 1)
        guard case .changes(let empty)? = batch?.first, batch?.count == 1 else {
            return XCTFail("one empty batch of changes: \(String(describing: batch))")
        }
        XCTAssertTrue(empty.isEmpty)
        XCTAssertNil(queue.take(gatheringChangesUntilMs: 0), "closed and drained")
    }
}

/// Whether the watchdog fired, written on its queue and read by the test.
private final class Flags: @unchecked Sendable {
    // @unchecked: `value` is read and written only with `lock` held.
    private let lock = NSLock()
    private var value = false

    var fired: Bool {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}
