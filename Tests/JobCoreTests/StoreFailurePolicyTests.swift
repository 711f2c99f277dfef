import Foundation
import XCTest
@testable import JobCore
import CSQLite
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The store-failure policy: resource failures are told from bugs, state changes the disk refuses
/// are kept (the latest of each record) and retried until they commit, new work is refused meanwhile,
/// and the store recovers by itself. The failure is a real one: another connection holding the
/// write lock (SQLITE_BUSY), or the process out of file descriptors.
final class StoreFailurePolicyTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    func testResourceFailuresAreToldFromBugs() {
        // Extended codes are `primary | (n << 8)` (sqlite3.h); Swift imports only the primary ones.
        let ioerrWrite = SQLITE_IOERR | (3 << 8), ioerrFsync = SQLITE_IOERR | (4 << 8)
        let constraintUnique = SQLITE_CONSTRAINT | (8 << 8)
        for rc in [SQLITE_FULL, ioerrWrite, ioerrFsync, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN, SQLITE_NOMEM] {
            XCTAssertTrue(SQLiteConnection.error(rc, "x").isResourceFailure, "sqlite \(rc)")
        }
        for rc in [SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_MISUSE, SQLITE_ERROR, constraintUnique, SQLITE_INTERNAL] {
            XCTAssertFalse(SQLiteConnection.error(rc, "x").isResourceFailure, "sqlite \(rc)")
        }
        XCTAssertTrue(StoreError(.unavailable, "x").isResourceFailure)
        XCTAssertFalse(StoreError(.io, "no code").isResourceFailure)
        XCTAssertFalse(StoreError(.corrupt, "x").isResourceFailure)
        XCTAssertFalse(StoreError(.closed, "x").isResourceFailure)
    }

    func testRefusedChangesAreKeptLatestFirstAndCommittedWhenTheLockIsFree() throws {
        let store = try SQLiteJobStore(path: dbPath, logger: .disabled, busyTimeoutMs: 50)
        defer { store.close() }
        let job = try create(store, 1, nodes: 2)
        let other = try SQLiteConnection(path: dbPath, create: false, busyTimeoutMs: 50)
        defer { other.close() }
        try other.execute("BEGIN IMMEDIATE")

        var running = job
        var node = NodeRecord(jobID: job.id, id: "root.0", parent: "root", position: 1, type: "fetch")
        for version in Int64(2)...Int64(40) {
            running.version = version
            running.state = version == 40 ? .succeeded : .running
            node.attempts = Int(version)
            store.enqueue(jobs: [running], nodes: [node], bodies: [
                (jobID: job.id, nodeID: "root.0", body: StoredBody(contentType: "text/plain", bytes: Array("v\(version)".utf8)))
            ])
        }
        XCTAssertThrowsError(try store.flush()) { XCTAssertEqual(($0 as? StoreError)?.isResourceFailure, true) }
        let degraded = store.health
        XCTAssertTrue(degraded.degraded)
        XCTAssertGreaterThanOrEqual(degraded.writeFailures, 1)
        // One job, one node, one body: the latest of each, however many changes came.
        XCTAssertEqual(degraded.pendingChanges, 3)
        XCTAssertEqual(degraded.lastError?.isResourceFailure, true)

        // New work is refused while degraded, and leaves nothing behind.
        XCTAssertThrowsError(try create(store, 2)) { XCTAssertEqual(($0 as? StoreError)?.isResourceFailure, true) }
        XCTAssertEqual(try store.job(id: job.id)?.version, 1, "nothing was committed")

        // The reader sees the old state while the lock is held; the writer gets it once it is free.
        let committed = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            try? store.waitUntilCommitted()
            committed.signal()
        }
        XCTAssertEqual(committed.wait(timeout: .now() + 0.3), .timedOut, "nothing can commit while the lock is held")
        try other.execute("ROLLBACK")
        XCTAssertEqual(committed.wait(timeout: .now() + 30), .success)

        let stored = try store.job(id: job.id)
        XCTAssertEqual(stored?.version, 40)
        XCTAssertEqual(stored?.state, .succeeded)
        XCTAssertEqual(try store.node(jobID: job.id, nodeID: "root.0")?.attempts, 40)
        XCTAssertEqual(try store.body(jobID: job.id, nodeID: "root.0")?.bytes, Array("v40".utf8))
        XCTAssertNil(try store.job(id: jobID(2)), "the refused submission left nothing")
        let healthy = store.health
        XCTAssertFalse(healthy.degraded)
        XCTAssertEqual(healthy.pendingChanges, 0)
        XCTAssertNil(healthy.lastError)
        try store.flush()
        try create(store, 2)
    }

    func testAFailedSubmissionAloneMakesTheStoreDegradedUntilAWriteCommits() throws {
        let store = try SQLiteJobStore(path: dbPath, logger: .disabled, busyTimeoutMs: 50)
        defer { store.close() }
        try create(store, 1)
        let other = try SQLiteConnection(path: dbPath, create: false, busyTimeoutMs: 50)
        defer { other.close() }
        try other.execute("BEGIN IMMEDIATE")
        XCTAssertThrowsError(try create(store, 2)) { XCTAssertEqual(($0 as? StoreError)?.isResourceFailure, true) }
        XCTAssertTrue(store.health.degraded)
        // Nothing was queued before it: a flush has nothing to wait for.
        try store.flush()
        try other.execute("ROLLBACK")
        // With nothing to retry, the writer's probe finds the disk writable again.
        XCTAssertTrue(store.waitForHealth(milliseconds: 30_000) { !$0.degraded })
        try create(store, 2)
    }

    func testABacklogSplitsIntoPartsThatKeepEachJobWhole() {
        var pending = PendingChanges()
        for n in 0..<50 {
            let (job, nodes) = makeJob(n, nodes: 1 + n % 7)
            let bodies = nodes.dropFirst().map { (jobID: job.id, nodeID: $0.id, body: StoredBody(contentType: nil, bytes: [1])) }
            // Every other job's node rows are not stored yet; a change queued after them changes the row to insert.
            if n % 2 == 1 {
                pending.merge(Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: nodes))
                pending.merge(Changes(jobs: [job], nodes: [nodes[0]], bodies: bodies))
            } else {
                pending.merge(Changes(jobs: [job], nodes: nodes, bodies: bodies))
            }
        }
        XCTAssertEqual(pending.unstored.count, (0..<50).filter { $0 % 2 == 1 }.map { 1 + $0 % 7 }.reduce(0, +))
        let parts = pending.split(maxRecords: 20)
        XCTAssertEqual(parts.map(\.unstored.count).reduce(0, +), pending.unstored.count)
        XCTAssertGreaterThan(parts.count, 1)
        XCTAssertEqual(parts.map(\.count).reduce(0, +), pending.count)
        for part in parts {
            XCTAssertLessThanOrEqual(part.count, 20)
            for key in part.nodes.keys { XCTAssertNotNil(part.jobs[key.jobID], "node of \(key.jobID) apart from its job") }
            for key in part.bodies.keys { XCTAssertNotNil(part.jobs[key.jobID], "body of \(key.jobID) apart from its job") }
            for key in part.unstored { XCTAssertNotNil(part.nodes[key], "unstored node of \(key.jobID) apart from its record") }
        }
        var rest = pending
        for part in parts { rest.remove(part) }
        XCTAssertTrue(rest.isEmpty)
        XCTAssertTrue(rest.unstored.isEmpty)
    }

    func testUnstoredRowsWaitForTheirFirstChangeOrTheirJobSettling() {
        var pending = PendingChanges(defersUnchangedRows: true)
        let (job, nodes) = makeJob(1, nodes: 4)
        pending.merge(Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: nodes))
        // Rows as queued are nothing to commit: a flush has nothing to wait for.
        XCTAssertTrue(pending.isEmpty)
        XCTAssertEqual(pending.count, 0)
        XCTAssertEqual(pending.unchanged[job.id]?.count, 4)

        // A node's first change is its row's insert, with the changed record.
        var started = nodes[1]
        started.state = .running
        pending.merge(Changes(jobs: [job], nodes: [started], bodies: []))
        XCTAssertEqual(pending.unstored, [NodeKey(jobID: job.id, position: 1)])
        XCTAssertEqual(pending.nodes[NodeKey(jobID: job.id, position: 1)]?.state, .running)
        XCTAssertEqual(pending.unchanged[job.id]?.count, 3)

        // Committed: kept rows stay, the written ones go; a later change of a stored row is an update.
        pending.removeAll()
        XCTAssertTrue(pending.isEmpty)
        XCTAssertEqual(pending.unchanged[job.id]?.count, 3)
        started.state = .succeeded
        pending.merge(Changes(jobs: [], nodes: [started], bodies: []))
        XCTAssertTrue(pending.unstored.isEmpty)

        // The job settles: every row it has not stored goes in with it, as it is.
        var settled = job
        settled.state = .failed
        pending.merge(Changes(jobs: [settled], nodes: [], bodies: []))
        XCTAssertNil(pending.unchanged[job.id])
        XCTAssertEqual(pending.unstored, Set([0, 2, 3].map { NodeKey(jobID: job.id, position: $0) }))
        XCTAssertEqual(pending.nodes.count, 4)
        // Rebuilt from what the writer kept of them, they are the rows the job was created with.
        for k in [0, 2, 3] { XCTAssertEqual(pending.nodes[NodeKey(jobID: job.id, position: k)], nodes[k]) }

        // A deleted job's rows are forgotten; without deferral rows are inserted at once, as before.
        let (other, otherNodes) = makeJob(2)
        pending.merge(Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: otherNodes))
        pending.forgetUnchanged(jobID: other.id)
        XCTAssertTrue(pending.unchanged.isEmpty)
        var eager = PendingChanges()
        eager.merge(Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: otherNodes))
        XCTAssertEqual(eager.unstored.count, otherNodes.count)
        XCTAssertTrue(eager.unchanged.isEmpty)
    }

    /// Rows that are not as a job is created with them (a node already changed) are written at once, not kept; rows
    /// whose positions do not follow each other are kept all the same.
    func testOnlyRowsAsCreatedWaitAndAnyPositionsAreKept() throws {
        var pending = PendingChanges(defersUnchangedRows: true)
        let (job, nodes) = makeJob(3, nodes: 6)
        var changed = nodes[4]
        changed.attempts = 1
        // Out of order, one twice, one changed.
        pending.merge(Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: [nodes[2], nodes[3], nodes[0], nodes[5], nodes[3], changed]))
        XCTAssertEqual(pending.unchanged[job.id]?.count, 4)
        XCTAssertEqual(pending.unstored, [NodeKey(jobID: job.id, position: 4)])
        XCTAssertEqual(pending.nodes[NodeKey(jobID: job.id, position: 4)], changed)

        var started = nodes[0]
        started.state = .running
        pending.merge(Changes(jobs: [], nodes: [started], bodies: []))
        XCTAssertEqual(pending.unchanged[job.id]?.count, 3)
        // A row never queued is not taken.
        var other = nodes[1]
        other.state = .running
        pending.merge(Changes(jobs: [], nodes: [other], bodies: []))
        XCTAssertEqual(pending.unchanged[job.id]?.count, 3)
        XCTAssertFalse(pending.unstored.contains(NodeKey(jobID: job.id, position: 1)))

        var settled = job
        settled.state = .succeeded
        pending.merge(Changes(jobs: [settled], nodes: [], bodies: []))
        XCTAssertNil(pending.unchanged[job.id])
        for k in [2, 3, 5] { XCTAssertEqual(pending.nodes[NodeKey(jobID: job.id, position: k)], nodes[k], "row \(k)") }
        XCTAssertEqual(pending.unstored, Set([0, 2, 3, 4, 5].map { NodeKey(jobID: job.id, position: $0) }))

        // A position kept apart, then reached by the positions that follow the first: one row, taken once.
        let row = try XCTUnwrap(UnchangedRow(nodes[1]))
        var rows = UnchangedRows()
        for position in [0, 3, 1, 2, 3] { rows.add(row, at: position) }
        XCTAssertEqual(rows.count, 4)
        XCTAssertTrue(rows.take(3))
        XCTAssertFalse(rows.take(3))
        var left: [Int] = []
        rows.forEach { position, _ in left.append(position) }
        XCTAssertEqual(left.sorted(), [0, 1, 2])
    }

    func testReadsOutOfFileDescriptorsAreResourceFailures() throws {
        let store = try openStore()
        defer { store.close() }
        try create(store, 1)
        // A second store on the file: its reader pool is empty, so a read must open a connection.
        let reader = try openStore()
        defer { reader.close() }

        var limit = rlimit()
        XCTAssertEqual(getrlimit(RLIMIT_NOFILE_VALUE, &limit), 0)
        let saved = limit
        let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 64
        limit.rlim_cur = rlim_t(open + 16)
        XCTAssertEqual(setrlimit(RLIMIT_NOFILE_VALUE, &limit), 0)
        var held: [Int32] = []
        for _ in 0..<64 {
            let fd = Glibc.open("/dev/null", O_RDONLY)
            if fd < 0 { break }
            held.append(fd)
        }
        var failure: Error?
        do { _ = try reader.job(id: jobID(1)) } catch { failure = error }
        for fd in held { close(fd) }
        var restore = saved
        setrlimit(RLIMIT_NOFILE_VALUE, &restore)

        let error = try XCTUnwrap(failure as? StoreError, "a read without descriptors must fail")
        XCTAssertTrue(error.isResourceFailure, "\(error)")
        XCTAssertNotNil(try reader.job(id: jobID(1)), "reads work again once descriptors are free")
    }
}

#if canImport(Glibc)
private let RLIMIT_NOFILE_VALUE = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
#endif
