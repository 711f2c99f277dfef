import CSQLite
import Foundation
import Threads
import XCTest
@testable import JobCore

#if canImport(Glibc)
import Glibc
#endif

/// A temporary folder per test, removed afterwards.
class StoreTestCase: XCTestCase, @unchecked Sendable {
    // @unchecked: the threads of `onThreads` call its helpers (`makeJob`, `create`, `makeStore`). The stored
    // properties (`folder`, `databaseURL`) are written only in `setUpWithError` and
    // `tearDown`, which XCTest runs before the test starts any thread and after `onThreads` has waited for them all.
    var folder = ""
    /// This test's database, in a class that runs on PostgreSQL.
    var databaseURL = ""

    /// True in the subclasses that run their inherited tests on PostgreSQL (PostgresStoreTests.swift).
    class var usesPostgres: Bool { false }
    /// The class's throwaway cluster while a PostgreSQL class runs (XCTest runs one class at a time).
    nonisolated(unsafe) static var postgres: PostgresTestCluster?

    override class func setUp() {
        super.setUp()
        postgres = PostgresTestCluster.started(if: usesPostgres)
    }

    override class func tearDown() {
        postgres?.stop()
        postgres = nil
        super.tearDown()
    }

    override func setUpWithError() throws {
        var template = Array("/tmp/jobserver-store-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw StoreError(.io, "mkdtemp failed") }
        folder = String(cString: made)
        // A durability test's child process runs the SQLite class's child test, which opens what it is given.
        guard Self.usesPostgres, ProcessInfo.processInfo.environment["JOBSERVER_STORE_CHILD_DB"] == nil else { return }
        guard let postgres = Self.postgres else { throw StoreError(.open, "the PostgreSQL cluster was not started") }
        databaseURL = try postgres.freshDatabase()
    }

    override func tearDown() {
        if !folder.isEmpty {
            var status: Int32 = 0
            var pid = pid_t()
            let args = ["rm", "-rf", folder]
            var argv: [UnsafeMutablePointer<CChar>?] = args.map { strdup($0) } + [nil]
            if posix_spawnp(&pid, "rm", nil, nil, &argv, environ) == 0 { waitpid(pid, &status, 0) }
            for p in argv { free(p) }
        }
        folder = ""
        databaseURL = ""
    }

    var dbPath: String { folder + "/data/jobs.sqlite" }

    func openStore(_ path: String? = nil) throws -> SQLiteJobStore {
        try SQLiteJobStore(path: path ?? dbPath)
    }

    /// The store the store-agnostic tests run on: SQLite at `dbPath`, or the test's database on PostgreSQL (every
    /// store made within one test opens the same database).
    func makeStore() throws -> JobStore {
        Self.usesPostgres ? try PostgresJobStore(url: databaseURL) : try openStore()
    }

    /// A job id that sorts by `n`, like the server's time-ordered ids.
    func jobID(_ n: Int) -> String {
        let digits = String(n)
        return "J" + String(repeating: "0", count: max(0, 10 - digits.count)) + digits
    }

    func makeJob(_ n: Int, state: NodeState = .pending, nodes count: Int = 3, finishedAt: Int64? = nil) -> (JobRecord, [NodeRecord]) {
        let id = jobID(n)
        var progress = Progress()
        progress.total = count
        progress.pending = count
        let job = JobRecord(
            id: id, name: "job \(n)", state: state, createdAt: 1_700_000_000_000 + Int64(n), finishedAt: finishedAt,
            request: .object(["graph": .object(["type": "list"]), "n": .int(n)]), progress: progress)
        var nodes = [NodeRecord(jobID: id, id: "root", parent: nil, position: 0, type: "list")]
        for i in 1..<max(count, 1) {
            nodes.append(NodeRecord(jobID: id, id: "root.\(i - 1)", parent: "root", position: i, type: "fetch"))
        }
        return (job, nodes)
    }

    @discardableResult
    func create(_ store: JobStore, _ n: Int, state: NodeState = .pending, nodes: Int = 3, finishedAt: Int64? = nil) throws -> JobRecord {
        let (job, nodeRecords) = makeJob(n, state: state, nodes: nodes, finishedAt: finishedAt)
        guard case .created(let stored) = try store.createJob(job, nodes: nodeRecords, idempotencyKey: nil, requestHash: nil) else {
            XCTFail("job \(n) not created")
            return job
        }
        return stored
    }

    /// Runs `body(i)` for i in 0..<count on `count` threads and waits for all.
    func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) throws -> Void) {
        let group = DispatchGroup()
        let failures = FailureBox()
        for i in 0..<count {
            group.enter()
            Thread.detachNewThread {
                do { try body(i) } catch { failures.add("\(error)") }
                group.leave()
            }
        }
        XCTAssertEqual(group.wait(timeout: .now() + 60), .success, "threads did not finish")
        XCTAssertEqual(failures.all, [])
    }
}

final class FailureBox: @unchecked Sendable {
    // @unchecked: `items` is read and written only with `lock` held.
    private let lock = NSLock()
    private var items: [String] = []
    func add(_ s: String) { lock.lock(); items.append(s); lock.unlock() }
    var all: [String] { lock.lock(); defer { lock.unlock() }; return items }
}

class StoreTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    func testCreateAndReadBackEveryField() throws {
        let store = try makeStore()
        defer { store.close() }
        var progress = Progress()
        progress.total = 3
        progress.running = 1
        progress.succeeded = 1
        progress.failed = 1
        let inner = NodeError(.httpStatus, "GET http://x/ answered 503", node: "root.1", status: 503)
        let job = JobRecord(
            id: "01JOB", name: "naïve — 日本語 😀", state: .running, createdAt: 1_733_000_000_123, startedAt: 1_733_000_000_200,
            finishedAt: nil, request: try JSONValue.parse(#"{"graph":{"type":"list","children":[]},"x":1.50}"#),
            metadata: .object(["by": "nightly", "n": .null]), deadlineMs: 60000, result: .null,
            error: NodeError(.allFailed, "all failed", node: "root", errors: [inner, NodeError(.timeout, "slow")]),
            version: 7, progress: progress)
        let nodes = [
            NodeRecord(jobID: "01JOB", id: "root", parent: nil, position: 0, type: "list", state: .running,
                       attempts: 0, startedAt: 1_733_000_000_200),
            NodeRecord(jobID: "01JOB", id: "root.0", parent: "root", position: 1, type: "fetch", state: .succeeded,
                       attempts: 2, startedAt: 1_733_000_000_201, finishedAt: 1_733_000_000_301, elapsedMs: 100,
                       status: 200, recovered: false, result: try JSONValue.parse(#"{"ok":true,"list":[1,"é",null]}"#)),
            NodeRecord(jobID: "01JOB", id: "root.1", parent: "root", position: 2, type: "fetch", state: .failed,
                       attempts: 1, status: 503, error: inner, recovered: true, result: "fallback"),
        ]
        XCTAssertEqual(try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil), .created(job))
        XCTAssertEqual(try store.job(id: "01JOB"), job)
        XCTAssertEqual(try store.nodes(jobID: "01JOB", includeResults: true), nodes)
        let light = try store.nodes(jobID: "01JOB", includeResults: false)
        XCTAssertEqual(light.map(\.result), [nil, nil, nil])
        XCTAssertEqual(light.map(\.id), ["root", "root.0", "root.1"])
        XCTAssertEqual(try store.node(jobID: "01JOB", nodeID: "root.1"), nodes[2])
        XCTAssertNil(try store.node(jobID: "01JOB", nodeID: "nope"))
        XCTAssertNil(try store.job(id: "nope"))
        XCTAssertEqual(try store.nodes(jobID: "nope", includeResults: true), [])
    }

    func testTextWithU0000AndQuotesRoundTrips() throws {
        let store = try makeStore()
        defer { store.close() }
        var (job, nodes) = makeJob(1)
        job.name = "a\u{0}b \"q\" \\ é"
        job.concurrencyKey = "k\u{0}1"
        guard case .created = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil) else {
            return XCTFail("not created")
        }
        XCTAssertEqual(try store.job(id: job.id)?.name, job.name)
        XCTAssertEqual(try store.job(id: job.id)?.concurrencyKey, "k\u{0}1")
        XCTAssertEqual(try store.listJobs(state: nil, limit: 5, cursor: nil).jobs.first?.name, job.name)
        job.name = "\u{0}"
        job.version = 2
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertEqual(try store.jobWithoutRequest(id: job.id)?.name, "\u{0}")
    }

    /// A map's copies are stored with its items, or (SQLite) with their first change or their job's end; a map
    /// whose items cannot be stored (here its node's items are stored already) leaves no row of its copies, which a
    /// restart could not line up with the graph.
    func testAMapExpansionThatFailsLeavesNoRowOfItsCopies() throws {
        let store = try makeStore()
        defer { store.close() }
        var job = try create(store, 1, state: .running, nodes: 1)
        let copy = { (id: String, position: Int) in
            NodeRecord(jobID: job.id, id: id, parent: "root", position: position, type: "fetch")
        }
        let first = MapExpansionRecord(jobID: job.id, nodeID: "root", firstPosition: 1, items: [1], nodes: [copy("root.a", 1)])
        try waitForCompletion { done in store.expandMap(first, done) }.get()
        let again = MapExpansionRecord(jobID: job.id, nodeID: "root", firstPosition: 2, items: [2], nodes: [copy("root.b", 2)])
        XCTAssertThrowsError(try waitForCompletion { done in store.expandMap(again, done) }.get())
        // The job ends: every row still waiting is written with it.
        job.state = .failed
        job.finishedAt = job.createdAt + 1
        job.version += 1
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertEqual(try store.nodes(jobID: job.id, includeResults: false).map(\.id).sorted(), ["root", "root.a"])
        XCTAssertEqual(try store.mapExpansions(jobID: job.id).map(\.firstPosition), [1])
    }

    func testNullResultStaysDistinctFromNoResult() throws {
        let store = try makeStore()
        defer { store.close() }
        var (withNull, nodes1) = makeJob(1)
        withNull.result = .null
        withNull.metadata = .null
        var (without, nodes2) = makeJob(2)
        without.result = nil
        without.metadata = nil
        without.name = ""
        _ = try store.createJob(withNull, nodes: nodes1, idempotencyKey: nil, requestHash: nil)
        _ = try store.createJob(without, nodes: nodes2, idempotencyKey: nil, requestHash: nil)
        XCTAssertEqual(try store.job(id: withNull.id)?.result, .some(.null))
        XCTAssertEqual(try store.job(id: withNull.id)?.metadata, .some(.null))
        XCTAssertEqual(try store.job(id: without.id)?.result, .none)
        XCTAssertEqual(try store.job(id: without.id)?.metadata, .none)
        XCTAssertEqual(try store.job(id: without.id)?.name, "")
    }

    func testIdempotencyKeyAnswersExistingOrConflict() throws {
        let store = try makeStore()
        defer { store.close() }
        let (first, nodes1) = makeJob(1)
        let (second, nodes2) = makeJob(2)
        XCTAssertEqual(try store.createJob(first, nodes: nodes1, idempotencyKey: "k", requestHash: "h1"), .created(first))
        XCTAssertEqual(try store.createJob(second, nodes: nodes2, idempotencyKey: "k", requestHash: "h1"), .existing(first))
        XCTAssertEqual(try store.createJob(second, nodes: nodes2, idempotencyKey: "k", requestHash: "h2"), .conflict(first))
        XCTAssertNil(try store.job(id: second.id), "a repeated key stores nothing")
        XCTAssertEqual(try store.nodes(jobID: second.id, includeResults: false), [])
        XCTAssertEqual(try store.createJob(second, nodes: nodes2, idempotencyKey: "other", requestHash: "h1"), .created(second))
    }

    func testConcurrentSubmissionsWithOneKeyCreateOneJob() throws {
        let store = try makeStore()
        defer { store.close() }
        let outcomes = FailureBox()
        onThreads(8) { i in
            let (job, nodes) = self.makeJob(i)
            switch try store.createJob(job, nodes: nodes, idempotencyKey: "same", requestHash: "h") {
            case .created: outcomes.add("created")
            case .existing: outcomes.add("existing")
            case .conflict: outcomes.add("conflict")
            }
        }
        XCTAssertEqual(outcomes.all.filter { $0 == "created" }.count, 1)
        XCTAssertEqual(outcomes.all.filter { $0 == "existing" }.count, 7)
        XCTAssertEqual(try store.jobCounts()[.pending], 1)
    }

    func testDuplicateJobIDFailsWithConstraint() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 1)
        let (again, nodes) = makeJob(1)
        XCTAssertThrowsError(try store.createJob(again, nodes: nodes, idempotencyKey: nil, requestHash: nil)) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .constraint)
        }
        try create(store, 2)
        XCTAssertEqual(try store.jobCounts()[.pending], 2)
    }

    func testDuplicateNodePositionLeavesNoHalfWrittenJob() throws {
        let store = try makeStore()
        defer { store.close() }
        var (job, nodes) = makeJob(1)
        nodes[2].position = 1
        XCTAssertThrowsError(try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil))
        XCTAssertNil(try store.job(id: job.id))
        XCTAssertEqual(try store.nodes(jobID: job.id, includeResults: false), [])
        job.id = "other"
        XCTAssertThrowsError(try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil))
    }

    func testEnqueuedChangesAreVisibleAfterFlush() throws {
        let store = try makeStore()
        defer { store.close() }
        var job = try create(store, 1)
        var nodes = try store.nodes(jobID: job.id, includeResults: true)
        let request = job.request
        job.state = .succeeded
        job.version = 9
        job.result = .array([1, 2])
        job.finishedAt = 1_800_000_000_000
        job.progress.pending = 0
        job.progress.succeeded = 3
        job.request = "ignored: a request never changes"
        nodes[1].state = .succeeded
        nodes[1].attempts = 1
        nodes[1].result = .object(["a": 1])
        nodes[1].status = 200
        nodes[2].state = .failed
        nodes[2].error = NodeError(.connect, "refused", node: "root.1")
        let body = StoredBody(contentType: "application/json; charset=utf-8", bytes: Array(#"{"a":1}"#.utf8))
        store.enqueue(jobs: [job], nodes: [nodes[1], nodes[2]], bodies: [(jobID: job.id, nodeID: "root.0", body: body)])
        store.enqueue(jobs: [], nodes: [], bodies: [(jobID: job.id, nodeID: "root.1", body: StoredBody(contentType: nil, bytes: []))])
        try store.flush()
        var expected = job
        expected.request = request
        XCTAssertEqual(try store.job(id: job.id), expected)
        XCTAssertEqual(try store.nodes(jobID: job.id, includeResults: true), nodes)
        XCTAssertEqual(try store.body(jobID: job.id, nodeID: "root.0"), body)
        XCTAssertEqual(try store.body(jobID: job.id, nodeID: "root.1"), StoredBody(contentType: nil, bytes: []))
        XCTAssertNil(try store.body(jobID: job.id, nodeID: "root"))
    }

    func testJobVersionAndStateAreReadAloneAndNilForNoSuchJob() throws {
        let store = try makeStore()
        defer { store.close() }
        var job = try create(store, 1)
        XCTAssertEqual(try store.jobVersion(id: job.id), job.version)
        XCTAssertEqual(try store.jobState(id: job.id), job.state)
        job.state = .succeeded
        job.version = 41
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertEqual(try store.jobVersion(id: job.id), 41)
        XCTAssertEqual(try store.jobState(id: job.id), .succeeded)
        XCTAssertNil(try store.jobVersion(id: "01NOSUCHJOB"))
        XCTAssertNil(try store.jobState(id: "01NOSUCHJOB"))
    }

    /// The writer yields the CPU to the fetcher and the engine (`StoreThread.writerNiceIncrement`); nothing else
    /// moves: the thread that opened the store keeps its priority.
    func testTheWriterRunsTenNiceStepsBelowTheThreadThatOpenedTheStore() throws {
        let before = Set(Self.threads(named: "store-writer").map(\.tid))
        let opener = currentThreadNice()
        let store = try makeStore()
        defer { store.close() }
        // Once a flush is answered, the writer's body runs, so its name and priority are set.
        try store.flush()
        let new = Self.threads(named: "store-writer").filter { !before.contains($0.tid) }
        XCTAssertEqual(new.count, 1, "one writer thread per store")
        XCTAssertEqual(new.map(\.nice), [min(19, opener + StoreThread.writerNiceIncrement)])
        XCTAssertEqual(StoreThread.writerNiceIncrement, 10)
        XCTAssertEqual(currentThreadNice(), opener)
    }

    /// This process's threads named `name`, with their nice values (`/proc/self/task/<tid>/stat`, field 19).
    private static func threads(named name: String) -> [(tid: String, nice: Int32)] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap { tid in
            let comm = try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8)
            guard comm?.trimmingCharacters(in: .whitespacesAndNewlines) == name,
                let stat = try? String(contentsOfFile: "/proc/self/task/\(tid)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return nil }
            // After the name in parentheses: field 3 (state) first, so field 19 is the 17th.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 16, let nice = Int32(fields[16]) else { return nil }
            return (tid: tid, nice: nice)
        }
    }

    func testLaterChangeOfARecordWinsWithinABatch() throws {
        let store = try makeStore()
        defer { store.close() }
        var job = try create(store, 1)
        var nodes = try store.nodes(jobID: job.id, includeResults: true)
        for version in 2...50 {
            job.version = Int64(version)
            nodes[0].attempts = version
            store.enqueue(jobs: [job], nodes: [nodes[0]], bodies: [])
        }
        try store.flush()
        XCTAssertEqual(try store.job(id: job.id)?.version, 50)
        XCTAssertEqual(try store.node(jobID: job.id, nodeID: "root")?.attempts, 50)
    }

    func testChangesToDeletedOrUnknownJobsAreIgnored() throws {
        let store = try makeStore()
        defer { store.close() }
        let (ghost, ghostNodes) = makeJob(99)
        store.enqueue(jobs: [ghost], nodes: ghostNodes,
                      bodies: [(jobID: ghost.id, nodeID: "root", body: StoredBody(contentType: nil, bytes: [1]))])
        try store.flush()
        XCTAssertNil(try store.job(id: ghost.id))
        XCTAssertNil(try store.body(jobID: ghost.id, nodeID: "root"))
    }

    func testChangesFromSeveralThreadsAreAllCommitted() throws {
        let store = try makeStore()
        defer { store.close() }
        for n in 0..<8 { try create(store, n) }
        onThreads(8) { n in
            var (job, nodes) = self.makeJob(n)
            for version in 1...200 {
                job.version = Int64(version)
                nodes[version % nodes.count].attempts = version
                store.enqueue(jobs: [job], nodes: [nodes[version % nodes.count]], bodies: [])
            }
        }
        try store.flush()
        for n in 0..<8 {
            XCTAssertEqual(try store.job(id: jobID(n))?.version, 200)
            XCTAssertEqual(try store.nodes(jobID: jobID(n), includeResults: false).map(\.attempts), [198, 199, 200])
        }
    }

    func testConcurrentCreatesAreAllStored() throws {
        let store = try makeStore()
        defer { store.close() }
        onThreads(8) { t in
            for i in 0..<40 { try self.create(store, t * 1000 + i) }
        }
        XCTAssertEqual(try store.jobCounts()[.pending], 320)
        XCTAssertEqual(try store.nodes(jobID: jobID(7039), includeResults: false).count, 3)
    }

    func testListIsNewestFirstWithStateFilterAndCursor() throws {
        let store = try makeStore()
        defer { store.close() }
        for n in 1...25 { try create(store, n, state: n % 3 == 0 ? .succeeded : .pending) }
        var seen: [String] = []
        var cursor: String?
        var pages = 0
        repeat {
            let page = try store.listJobs(state: nil, limit: 10, cursor: cursor)
            seen += page.jobs.map(\.id)
            XCTAssertTrue(page.jobs.allSatisfy { $0.result == nil && $0.request == .null })
            cursor = page.nextCursor
            pages += 1
        } while cursor != nil && pages < 10
        XCTAssertEqual(pages, 3)
        XCTAssertEqual(seen, (1...25).reversed().map(jobID))

        let succeeded = try store.listJobs(state: .succeeded, limit: 5, cursor: nil)
        XCTAssertEqual(succeeded.jobs.map(\.id), [24, 21, 18, 15, 12].map(jobID))
        XCTAssertEqual(succeeded.jobs.first?.name, "job 24")
        let rest = try store.listJobs(state: .succeeded, limit: 5, cursor: succeeded.nextCursor)
        XCTAssertEqual(rest.jobs.map(\.id), [9, 6, 3].map(jobID))
        XCTAssertNil(rest.nextCursor)
        XCTAssertEqual(try store.listJobs(state: .failed, limit: 5, cursor: nil), JobPage(jobs: [], nextCursor: nil))
        let exact = try store.listJobs(state: .succeeded, limit: 8, cursor: nil)
        XCTAssertEqual(exact.jobs.count, 8)
        XCTAssertNil(exact.nextCursor, "no cursor when the page ends exactly at the last job")
        XCTAssertEqual(try store.listJobs(state: nil, limit: Int.max, cursor: nil).jobs.count, 25)
        XCTAssertEqual(try store.listJobs(state: nil, limit: 0, cursor: nil), JobPage(jobs: [], nextCursor: nil))
    }

    func testBadCursorIsRefused() throws {
        let store = try makeStore()
        defer { store.close() }
        let outOfForm = ["", "x", "c", "c4", "c4g", "J0000000001", "cff", "c0a", "c1f", "c80", "C4a4a"]
        for cursor in outOfForm + ["c" + String(repeating: "41", count: 600)] {
            XCTAssertThrowsError(try store.listJobs(state: nil, limit: 5, cursor: cursor), cursor) { error in
                XCTAssertEqual((error as? StoreError)?.kind, .badCursor)
            }
        }
    }

    func testEveryCursorOfTheDocumentedFormStartsAPage() throws {
        let store = try makeStore()
        defer { store.close() }
        for n in 1...3 { try create(store, n) }
        // openapi.yaml: ^c([2-7][0-9a-f]){1,99}$. "c7f" sorts after every id, "c20" before every one.
        XCTAssertEqual(try store.listJobs(state: nil, limit: 5, cursor: "c7f").jobs.count, 3)
        XCTAssertEqual(try store.listJobs(state: nil, limit: 5, cursor: "c20").jobs.count, 0)
    }

    func testDeleteRemovesNodesAndBodies() throws {
        let store = try makeStore()
        defer { store.close() }
        let job = try create(store, 1)
        try create(store, 2)
        store.enqueue(jobs: [], nodes: [], bodies: [(jobID: job.id, nodeID: "root.0", body: StoredBody(contentType: "text/plain", bytes: [65]))])
        try store.flush()
        XCTAssertNotNil(try store.body(jobID: job.id, nodeID: "root.0"))
        XCTAssertTrue(try store.deleteJob(id: job.id))
        XCTAssertFalse(try store.deleteJob(id: job.id))
        XCTAssertNil(try store.job(id: job.id))
        XCTAssertEqual(try store.nodes(jobID: job.id, includeResults: true), [])
        XCTAssertNil(try store.body(jobID: job.id, nodeID: "root.0"))
        XCTAssertEqual(try store.nodes(jobID: jobID(2), includeResults: true).count, 3)
    }

    func testUnfinishedJobsComeOldestFirstWithTheirNodes() throws {
        let store = try makeStore()
        defer { store.close() }
        let states: [NodeState] = [.running, .succeeded, .pending, .failed, .cancelled, .running, .skipped]
        for (n, state) in states.enumerated() { try create(store, n, state: state, nodes: n + 1) }
        var nodes = try store.nodes(jobID: jobID(5), includeResults: true)
        nodes[3].state = .succeeded
        nodes[3].result = .object(["done": true])
        store.enqueue(jobs: [], nodes: [nodes[3]], bodies: [])
        try store.flush()
        let unfinished = try store.unfinishedJobs()
        XCTAssertEqual(unfinished.map(\.job.id), [0, 2, 5].map(jobID))
        XCTAssertEqual(unfinished.map(\.nodes.count), [1, 3, 6])
        XCTAssertEqual(unfinished[2].nodes.map(\.position), Array(0..<6))
        XCTAssertEqual(unfinished[2].nodes[3].result, .object(["done": true]))
        XCTAssertEqual(unfinished[1].job, makeJob(2, state: .pending, nodes: 3).0)
    }

    func testSweepDeletesOnlySettledJobsFinishedBefore() throws {
        let store = try makeStore()
        defer { store.close() }
        // More than one sweep chunk (500).
        for n in 0..<620 { try create(store, n, state: .succeeded, nodes: 1, finishedAt: 1000) }
        try create(store, 1000, state: .failed, finishedAt: 5000)
        try create(store, 1001, state: .running, finishedAt: 10)
        try create(store, 1002, state: .pending)
        try create(store, 1003, state: .cancelled, finishedAt: 1999)
        XCTAssertEqual(try store.sweep(finishedBeforeMs: 2000), 621)
        XCTAssertEqual(try store.listJobs(state: nil, limit: 100, cursor: nil).jobs.map(\.id), [1002, 1001, 1000].map(jobID))
        XCTAssertEqual(try store.nodes(jobID: jobID(5), includeResults: false), [])
        XCTAssertEqual(try store.sweep(finishedBeforeMs: 2000), 0)
    }

    func testJobCountsCoverEveryState() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 1, state: .running)
        try create(store, 2, state: .running)
        try create(store, 3, state: .failed)
        let counts = try store.jobCounts()
        XCTAssertEqual(counts.count, NodeState.allCases.count)
        XCTAssertEqual(counts[.running], 2)
        XCTAssertEqual(counts[.failed], 1)
        XCTAssertEqual(counts[.pending], 0)
    }

    func testReopenKeepsJobsAndSchemaVersion() throws {
        var store: JobStore? = try makeStore()
        if let store {
            try create(store, 1)
            store.enqueue(jobs: [makeJob(1, state: .running).0], nodes: [], bodies: [])
            store.close()
        }
        store = nil
        let reopened = try makeStore()
        defer { reopened.close() }
        XCTAssertEqual(try reopened.job(id: jobID(1))?.state, .running, "close writes what was queued")
        try assertSchemaIsCurrent()
    }

    /// The stored schema version is this code's.
    func assertSchemaIsCurrent() throws {
        let raw = try SQLiteConnection(path: dbPath, create: false)
        defer { raw.close() }
        XCTAssertEqual(try StoreSchema.userVersion(raw), StoreSchema.currentVersion)
    }

    func testARequestStoredInItsJobRowBeforeVersion9IsStillReadAndDeletedWithIt() throws {
        // Two jobs with an input, then the file made as version 8 left it: the requests in the jobs' rows.
        var store = try openStore()
        for n in [1, 2] {
            var (job, nodes) = makeJob(n)
            job.request = .object(["graph": .object(["type": "list"]), "input": .object(["n": .int(n)])])
            _ = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        }
        store.close()
        let raw = try SQLiteConnection(path: dbPath, create: false)
        try raw.execute(
            "UPDATE jobs SET request = (SELECT request FROM job_requests WHERE job_id = jobs.id); DROP TABLE job_requests; "
                + "PRAGMA user_version = 8")
        raw.close()

        store = try openStore()
        defer { store.close() }
        try assertSchemaIsCurrent()
        XCTAssertEqual(try store.job(id: jobID(1))?.request["input"]?["n"], .int(1))
        XCTAssertEqual(try store.jobWithoutRequest(id: jobID(1))?.request, .object(["input": .object(["n": .int(1)])]))
        // A job written now keeps its request apart from its row, which stays small whatever the request.
        var (job, nodes) = makeJob(3)
        job.request = .object(["graph": .object(["type": "list"]), "input": .string(String(repeating: "x", count: 100_000))])
        _ = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        XCTAssertEqual(try store.job(id: jobID(3))?.request, job.request)
        XCTAssertEqual(try store.jobWithoutRequest(id: jobID(3))?.request["input"], job.request["input"])
        let check = try SQLiteConnection(path: dbPath, create: false)
        defer { check.close() }
        let sizes = try check.prepare("SELECT length(request) FROM jobs WHERE id = ?1")
        sizes.bind(1, jobID(3))
        XCTAssertTrue(try sizes.step())
        XCTAssertEqual(sizes.int(0), 0)
        sizes.reset()
        // Deleting a job deletes its request, wherever it is.
        for n in [1, 3] { XCTAssertTrue(try store.deleteJob(id: jobID(n))) }
        let left = try check.prepare("SELECT count(*) FROM job_requests")
        XCTAssertTrue(try left.step())
        XCTAssertEqual(left.int(0), 0)
        left.reset()
        XCTAssertEqual(try store.job(id: jobID(2))?.request["input"]?["n"], .int(2))
    }

    func testFileFromANewerVersionIsRefused() throws {
        try openStore().close()
        let raw = try SQLiteConnection(path: dbPath, create: false)
        try raw.execute("PRAGMA user_version = \(StoreSchema.currentVersion + 1)")
        raw.close()
        XCTAssertThrowsError(try openStore()) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .migrate)
        }
    }

    func testNotADatabaseIsRefused() throws {
        let path = folder + "/garbage.sqlite"
        let file = fopen(path, "w")
        fputs(String(repeating: "this is not sqlite\n", count: 400), file)
        fclose(file)
        XCTAssertThrowsError(try openStore(path)) { error in
            XCTAssertTrue([.corrupt, .open, .migrate].contains((error as? StoreError)?.kind), "\(error)")
        }
    }

    func testInMemoryPathIsRefused() {
        for path in ["", ":memory:"] {
            XCTAssertThrowsError(try SQLiteJobStore(path: path)) { XCTAssertEqual(($0 as? StoreError)?.kind, .open) }
        }
    }

    func testCreatedJobIsVisibleToAnotherStoreOnTheSameFile() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 1)
        let second = try makeStore()
        defer { second.close() }
        XCTAssertEqual(try second.job(id: jobID(1))?.name, "job 1")
    }

    func testClosedStoreRefusesWork() throws {
        let store = try makeStore()
        store.close()
        store.close()
        XCTAssertThrowsError(try create(store, 1)) { XCTAssertEqual(($0 as? StoreError)?.kind, .closed) }
        XCTAssertThrowsError(try store.job(id: "x")) { XCTAssertEqual(($0 as? StoreError)?.kind, .closed) }
        XCTAssertThrowsError(try store.flush()) { XCTAssertEqual(($0 as? StoreError)?.kind, .closed) }
        store.enqueue(jobs: [makeJob(1).0], nodes: [], bodies: [])
    }

    func testReadsDoNotWaitForAWriter() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 1)
        // Another connection holds the write lock with uncommitted rows.
        let other = try SQLiteConnection(path: dbPath, create: false)
        defer { other.close() }
        try other.execute("BEGIN IMMEDIATE; UPDATE jobs SET name = 'uncommitted'")
        // The lock is held until the ROLLBACK below: a read that waited for it would fail with SQLITE_BUSY.
        XCTAssertEqual(try store.job(id: jobID(1))?.name, "job 1")
        XCTAssertEqual(try store.listJobs(state: nil, limit: 5, cursor: nil).jobs.count, 1)
        try other.execute("ROLLBACK")
    }

    func testReadsRunConcurrentlyWithWrites() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 0)
        let reads = FailureBox()
        onThreads(3) { t in
            if t == 0 {
                for n in 1...150 { try self.create(store, n) }
                var (job, _) = self.makeJob(0)
                for v in 1...300 {
                    job.version = Int64(v)
                    store.enqueue(jobs: [job], nodes: [], bodies: [])
                }
                try store.flush()
            } else {
                var last: Int64 = 0
                for _ in 0..<300 {
                    guard let job = try store.job(id: self.jobID(0)) else { throw StoreError(.io, "job vanished") }
                    if job.version < last { reads.add("version went back from \(last) to \(job.version)") }
                    last = job.version
                    let page = try store.listJobs(state: .pending, limit: 20, cursor: nil)
                    if page.jobs.isEmpty { reads.add("empty page") }
                }
            }
        }
        XCTAssertEqual(reads.all, [])
        XCTAssertEqual(try store.job(id: jobID(0))?.version, 300)
        XCTAssertEqual(try store.jobCounts()[.pending], 151)
    }
}

class StoreFailureTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    func testWritesFailWhileAnotherProcessHoldsTheLockAndRecoverAfter() throws {
        let store = try SQLiteJobStore(path: dbPath, logger: .disabled, busyTimeoutMs: 100)
        defer { store.close() }
        var job = try create(store, 1)
        let other = try SQLiteConnection(path: dbPath, create: false, busyTimeoutMs: 100)
        defer { other.close() }
        try other.execute("BEGIN IMMEDIATE")
        XCTAssertThrowsError(try create(store, 2)) { XCTAssertEqual(($0 as? StoreError)?.isResourceFailure, true) }
        job.version = 2
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        XCTAssertThrowsError(try store.flush()) { XCTAssertEqual(($0 as? StoreError)?.isResourceFailure, true) }
        XCTAssertThrowsError(try store.deleteJob(id: job.id)) { XCTAssertEqual(($0 as? StoreError)?.isResourceFailure, true) }
        XCTAssertTrue(store.health.degraded)
        try other.execute("ROLLBACK")

        // The kept change commits on a retry, with nothing enqueued again.
        try store.waitUntilCommitted()
        XCTAssertEqual(try store.job(id: job.id)?.version, 2)
        XCTAssertFalse(store.health.degraded)
        try store.flush()
        try create(store, 2)
        job.version = 3
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertEqual(try store.job(id: job.id)?.version, 3)
        XCTAssertNotNil(try store.job(id: jobID(2)))
    }

    func testOneBadSubmissionInABatchFailsAlone() throws {
        let store = try makeStore()
        defer { store.close() }
        try create(store, 0)
        let results = FailureBox()
        // Several submitters at once so that the duplicate shares a batch with good jobs.
        onThreads(6) { t in
            for round in 0..<20 {
                let n = t == 0 ? 0 : t * 100 + round
                let (job, nodes) = self.makeJob(n)
                do {
                    _ = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil)
                    results.add("ok")
                } catch let error as StoreError where error.kind == .constraint && n == 0 {
                    results.add("duplicate")
                }
            }
        }
        XCTAssertEqual(results.all.filter { $0 == "duplicate" }.count, 20)
        XCTAssertEqual(results.all.filter { $0 == "ok" }.count, 100)
        XCTAssertEqual(try store.jobCounts()[.pending], 101)
    }
}

class SQLiteWALTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    /// State changes are committed without an fsync; once the writer has nothing to do it copies them into the
    /// database file, so that the next submission's fsynced commit flushes only its own pages.
    func testAnIdleWriterCopiesTheWALIntoTheDatabaseFile() throws {
        let store = try openStore()
        defer { store.close() }
        let job = try create(store, 1, nodes: 400)
        // 400 bodies of 4 KiB: about 1.6 MB, under the 1,000 pages at which SQLite's own checkpoint runs in a commit.
        let bytes = Array(repeating: UInt8(ascii: "x"), count: 4096)
        store.enqueue(jobs: [], nodes: [], bodies: (0..<400).map { (jobID: job.id, nodeID: "root.\($0)", body: StoredBody(contentType: nil, bytes: bytes)) })
        try store.flush()
        XCTAssertTrue(store.waitUntilWALCopied(milliseconds: 30_000), "the writer did not copy the WAL once idle")
        XCTAssertGreaterThan(try fileSize(dbPath), 400 * 4096, "the bodies are in the database file")
        XCTAssertEqual(try store.body(jobID: job.id, nodeID: "root.399")?.bytes, bytes)
    }

    /// A WAL grown past `journal_size_limit` is emptied by the idle writer, not cut back inside the next commit,
    /// which is a submission's.
    func testAnIdleWriterEmptiesAWALGrownPastItsLimit() throws {
        let store = try openStore()
        defer { store.close() }
        let job = try create(store, 1, nodes: 20)
        // 17 bodies of 4 MiB in one commit: the WAL holds more than the 64 MiB limit until a checkpoint.
        let bytes = Array(repeating: UInt8(ascii: "x"), count: 4 << 20)
        store.enqueue(jobs: [], nodes: [], bodies: (0..<17).map { (jobID: job.id, nodeID: "root.\($0)", body: StoredBody(contentType: nil, bytes: bytes)) })
        try store.flush()
        XCTAssertTrue(store.waitUntilWALCopied(milliseconds: 30_000), "the writer did not copy the WAL once idle")
        XCTAssertEqual(try fileSize(dbPath + "-wal"), 0, "the WAL past its limit is emptied")
        XCTAssertEqual(try store.body(jobID: job.id, nodeID: "root.16")?.bytes, bytes)
    }

    /// SQLite keeps no memory statistics, which would take a process-wide mutex around every allocation it makes.
    func testSQLiteKeepsNoMemoryStatistics() throws {
        let store = try openStore()
        defer { store.close() }
        let job = try create(store, 1, nodes: 50)
        XCTAssertEqual(try store.nodes(jobID: job.id, includeResults: true).count, 50)
        var current: sqlite3_int64 = -1
        var highest: sqlite3_int64 = -1
        XCTAssertEqual(sqlite3_status64(SQLITE_STATUS_MEMORY_USED, &current, &highest, 0), SQLITE_OK)
        XCTAssertEqual(current, 0, "bytes counted in use")
        XCTAssertEqual(highest, 0, "most bytes counted in use")
    }

    /// A batch's bodies go into `bodies` in their key's order, which its rowids, given in the order rows are
    /// inserted, show: a B-tree filled in its order writes each page once. (The node rows' order, which nothing in
    /// the file shows, is `WriteQueueTests.testPendingChangesAreTakenInTheirRowsKeyOrder`'s.)
    func testABatchIsWrittenInItsRowsKeyOrder() throws {
        let store = try openStore()
        defer { store.close() }
        let job = try create(store, 1, nodes: 200)
        var positions = Array(1..<200)
        positions.shuffle()
        store.enqueue(
            jobs: [], nodes: [],
            bodies: positions.map { (jobID: job.id, nodeID: "root.\($0 - 1)", body: StoredBody(contentType: nil, bytes: [1])) })
        try store.flush()
        let raw = try SQLiteConnection(path: dbPath, create: false)
        defer { raw.close() }
        let rows = try raw.prepare("SELECT node_id FROM bodies ORDER BY rowid")
        var inserted: [String] = []
        while try rows.step() { inserted.append(rows.string(0) ?? "") }
        rows.reset()
        XCTAssertEqual(inserted.count, 199)
        XCTAssertEqual(inserted, inserted.sorted(), "bodies inserted in node id order")
    }

    private func fileSize(_ path: String) throws -> Int {
        (try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
    }
}
