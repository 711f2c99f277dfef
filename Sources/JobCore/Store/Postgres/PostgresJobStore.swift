#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The `JobStore` on a PostgreSQL database (API.md §10), with the SQLite store's semantics.
///
/// **Writes.** One writer thread owns the only writing connection and the same queue as `SQLiteJobStore`
/// (`WriteQueue`, `WriteOp`): it takes everything queued at once and commits it in one transaction with
/// statements prepared once per connection (group commit); callers that need an answer wait for the commit
/// that includes their rows, `flush(completion)` is answered from the writer thread after it.
///
/// **Durability.** A batch holding a `createJob` commits with `synchronous_commit` on (the server's WAL is
/// flushed before `COMMIT` returns): a `201` promises the job survives anything. Other batches commit with
/// `SET LOCAL synchronous_commit = off`, which survives the death of this process (the commit is in the
/// server) but not a crash of PostgreSQL's machine within its WAL writer delay — the contract SQLite's
/// `synchronous=NORMAL` gives state changes, which recovery redoes.
///
/// **Failures.** A write that fails for lack of a resource (the server unreachable or shutting down, disk full,
/// a serialization failure: `StoreError.isResourceFailure` after `PostgresConnection`'s SQLSTATE mapping) keeps
/// the state changes and retries them with the SQLite writer's doubling delay; the store is degraded meanwhile
/// and refuses new work at once. A lost connection is opened again by the next attempt.
///
/// **Reads** borrow connections from a small pool; reads that need one snapshot run in a
/// `REPEATABLE READ READ ONLY` transaction.
///
/// **Leases.** Several servers may share one database (API.md §10): each unfinished job is run by the server that
/// holds its lease (`PostgresLeases`), renewed by a heartbeat and claimed by another server once it expires
/// (`PostgresLeaseKeeper`); every write of a job's state is fenced by the lease's generation.
public final class PostgresJobStore: SharedJobStore, @unchecked Sendable {
    // @unchecked: `closed` is read and written only under `closeMonitor`; the rest is immutable or thread-safe
    // (the queue and pool have their own locks, the writer runs on its own thread).
    private let logger: Logger
    private let queue: WriteQueue
    let readers: PostgresReaderPool
    private let writerThread: StoreThread
    private let writerStatus: WriterStatus
    private let closeMonitor = StoreMonitor()
    private var closed = false
    let leases: PostgresLeases
    private var keeper: PostgresLeaseKeeper?
    private let url: String
    private let hostSlots: PostgresHostSlots
    let keyAdmission: PostgresKeyAdmission
    let hostRates: PostgresHostRates

    /// The default of `--lease-ttl` (API.md §10).
    public static let defaultLeaseTtlMs: Int64 = 15_000

    /// Connects (a `postgres://` URL or libpq connection string) and migrates.
    /// - Parameter leaseTtlMs: how long this server's leases last without renewal; a dead server's jobs are taken
    ///   over this long after its last heartbeat.
    /// - Throws: `StoreError` of kind `open` (with libpq's reason) or `migrate`.
    public init(url: String, logger: Logger = .disabled, leaseTtlMs: Int64 = PostgresJobStore.defaultLeaseTtlMs) throws {
        self.logger = logger
        self.url = url
        let connection = try PostgresConnection(url: url)
        do {
            try PostgresSchema.migrate(connection, logger: logger)
        } catch {
            connection.close()
            throw error
        }
        let leases = PostgresLeases(ttlMs: max(100, leaseTtlMs))
        self.leases = leases
        let queue = WriteQueue()
        let writer = PostgresStoreWriter(connection: connection, logger: logger, leases: leases)
        self.queue = queue
        self.writerStatus = writer.status
        let readers = PostgresReaderPool(url: url)
        self.readers = readers
        self.hostSlots = PostgresHostSlots(url: url, logger: logger)
        let keyAdmission = PostgresKeyAdmission(readers: readers, owner: leases.owner, logger: logger)
        self.keyAdmission = keyAdmission
        writer.keysWritten = { keys in keyAdmission.request(keys) }
        self.hostRates = PostgresHostRates(url: url, logger: logger)
        self.writerThread = try StoreThread(name: "store-writer", niceIncrement: StoreThread.writerNiceIncrement) {
            writer.run(queue)
        }
        logger.debug("store opened", ["database": .string("postgresql"), "server": .string(leases.owner)])
    }

    // MARK: Leases

    public func attach(_ delegate: SharedStoreDelegate) {
        leases.delegate = delegate
        keyAdmission.delegate = delegate as? KeyAdmissionDelegate
    }

    public func beginLeasing() {
        closeMonitor.lock()
        defer { closeMonitor.unlock() }
        guard !closed, keeper == nil else { return }
        let keeper = PostgresLeaseKeeper(url: url, leases: leases, logger: logger) { ids, db in
            var unreadable: [UnreadableJob] = []
            let jobs = try Self.loadJobs(ids, db, unreadable: &unreadable)
            return (jobs, unreadable)
        }
        let keyAdmission = self.keyAdmission
        keeper.onAdmitted = { payload in keyAdmission.heard(payload) }
        do {
            try keeper.start()
            self.keeper = keeper
        } catch {
            logger.error("the lease keeper could not start; this server takes over no jobs", ["error": .string("\(error)")])
        }
    }

    public var leasesHold: Bool { leases.hold }

    public func released(jobID: String) { leases.release(jobID) }

    public var leaseTtlMs: Int64 { leases.ttlMs }

    public func acquireHostSlot(_ host: String, limit: Int, _ completion: @escaping @Sendable (Bool) -> Void) {
        hostSlots.acquire(host, limit: limit, completion)
    }

    public func releaseHostSlot(_ host: String) { hostSlots.release(host) }

    public func requestCancel(id: String) throws -> Bool {
        try readers.with { db in
            let rows = try db.run(
                prepared: "request_cancel",
                "WITH asked AS (UPDATE jobs SET cancel_requested_at = \(PostgresLeases.nowMs) WHERE id = $1 "
                    + "AND state IN \(Self.unfinished) RETURNING id) "
                    + "SELECT pg_notify('\(PostgresLeases.cancelChannel)', id) FROM asked", [.text(id)])
            return !rows.rows.isEmpty
        }
    }

    deinit { close() }

    // MARK: Writes

    /// The job and its nodes in one transaction, whatever `nodesMayFollow` says: another server may read them at once.
    public func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?, nodesMayFollow: Bool,
        completion: @escaping @Sendable (Result<CreateOutcome, StoreError>) -> Void
    ) {
        let request = CreateRequest(job: job, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash)
        queue.push(answering: completion) { .create(request, $0) }
    }

    public func enqueue(
        jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)], urgent: Bool
    ) {
        queue.push(Changes(jobs: jobs, nodes: nodes, bodies: bodies, urgent: urgent), logger: logger)
    }

    public func enqueue(unstoredNodes nodes: [NodeRecord]) {
        queue.push(Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: nodes), logger: logger)
    }

    public func flush(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        queue.push(answering: completion) { .barrier($0) }
    }

    public func whenCommitted(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        queue.push(answering: completion) { .committed($0) }
    }

    public var health: StoreHealth { writerStatus.health }

    public func waitForHealth(milliseconds: Int64, until accept: (StoreHealth) -> Bool) -> Bool {
        writerStatus.wait(milliseconds: milliseconds, until: accept)
    }

    public func deleteJob(id: String, _ completion: @escaping @Sendable (Result<Bool, StoreError>) -> Void) {
        queue.push(answering: completion) { .delete(id, $0) }
    }

    /// Deletes settled jobs finished before `finishedBeforeMs`, 500 per transaction.
    public func sweep(finishedBeforeMs: Int64) throws -> Int {
        try queue.sweep(finishedBeforeMs: finishedBeforeMs)
    }

    public func expandMap(_ expansion: MapExpansionRecord, _ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        queue.push(answering: completion) { .expand(expansion, $0) }
    }

    public func close() {
        closeMonitor.lock()
        let wasClosed = closed
        closed = true
        closeMonitor.unlock()
        if wasClosed { return }
        closeMonitor.lock()
        let keeper = self.keeper
        closeMonitor.unlock()
        keeper?.stop()
        keyAdmission.close()
        hostSlots.close()
        hostRates.close()
        queue.close()
        writerThread.join()
        // Everything is written: the jobs still held go to the other servers at their next heartbeat rather
        // than a lease time from now.
        let held = Array(leases.ownedSnapshot.keys)
        if !held.isEmpty {
            do {
                try readers.with { db in try leases.release(held, db) }
            } catch {
                logger.warning("leases could not be given up; other servers take the jobs when they expire", [
                    "error": .string("\(error)")
                ])
            }
        }
        readers.close()
        logger.debug("store closed", ["database": .string("postgresql")])
    }

    // MARK: Reads

    public func job(id: String) throws -> JobRecord? {
        try readJob(id: id, shown: false)
    }

    public func jobWithoutRequest(id: String) throws -> JobRecord? {
        try readJob(id: id, shown: true)
    }

    /// The job row; a result that refers to its root's is assembled from the node rows of the same snapshot
    /// (read in one only then, so that a job without one costs one round trip as before).
    private func readJob(id: String, shown: Bool) throws -> JobRecord? {
        let first = try readers.with { db in
            let rows = try db.run(prepared: "job", "SELECT \(PGRows.job) FROM jobs WHERE id = $1", [.text(id)])
            return try PGRows.rows(rows).first.map { try PGRows.job($0, shown: shown) }
        }
        guard let first, ResultAssembly.needsNodes(first) else { return first }
        return try readers.snapshot { db in
            let rows = try db.run(prepared: "job", "SELECT \(PGRows.job) FROM jobs WHERE id = $1", [.text(id)])
            guard var job = try PGRows.rows(rows).first.map({ try PGRows.job($0, shown: shown) }) else { return nil }
            try PGRows.assembleResult(of: &job, db: db)
            return job
        }
    }

    public func jobVersion(id: String) throws -> Int64? {
        try readers.with { db in
            let rows = try db.run(prepared: "job_version", "SELECT version FROM jobs WHERE id = $1", [.text(id)])
            guard let row = PGRows.rows(rows).first else { return nil }
            return row.int64(0)
        }
    }

    public func nodeCount(id: String) throws -> Int? {
        try readers.with { db in
            let rows = try db.run(prepared: "job_node_count", "SELECT p_total FROM jobs WHERE id = $1", [.text(id)])
            guard let row = PGRows.rows(rows).first else { return nil }
            return row.int(0)
        }
    }

    public func jobState(id: String) throws -> NodeState? {
        try readers.with { db in
            let rows = try db.run(prepared: "job_state", "SELECT state FROM jobs WHERE id = $1", [.text(id)])
            guard let row = PGRows.rows(rows).first else { return nil }
            return try PGRows.state(row, 0)
        }
    }

    public func listJobs(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage {
        let after = try cursor.map(JobCursor.decode)
        guard limit > 0 else { return JobPage(jobs: [], nextCursor: nil) }
        var sql = "SELECT \(PGRows.listedJob) FROM jobs"
        var parameters: [PostgresParameter] = []
        var conditions: [String] = []
        if let state {
            parameters.append(.text(state.rawValue))
            conditions.append("state = $\(parameters.count)")
        }
        if let after {
            parameters.append(.text(after))
            conditions.append("id < $\(parameters.count)")
        }
        if !conditions.isEmpty { sql += " WHERE " + conditions.joined(separator: " AND ") }
        parameters.append(.int(Int64(min(limit, Int(Int32.max))) + 1))
        sql += " ORDER BY id DESC LIMIT $\(parameters.count)"
        return try readers.with { db in
            let rows = PGRows.rows(try db.run(prepared: "list_\(state != nil)_\(after != nil)", sql, parameters))
            var jobs: [JobRecord] = []
            jobs.reserveCapacity(min(limit, rows.count))
            for row in rows.prefix(limit) { jobs.append(try PGRows.job(row)) }
            let next = rows.count > limit ? jobs.last.map { JobCursor.encode($0.id) } : nil
            return JobPage(jobs: jobs, nextCursor: next)
        }
    }

    public func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord] {
        let columns = includeResults ? PGRows.node : PGRows.nodeWithoutResult
        let read = { (db: PostgresConnection) throws -> [NodeRecord] in
            let rows = try db.run(
                prepared: "nodes_\(includeResults)", "SELECT \(columns) FROM nodes WHERE job_id = $1 ORDER BY position",
                [.text(jobID)])
            return try PGRows.rows(rows).map(PGRows.node)
        }
        let first = try readers.with(read)
        guard includeResults, first.contains(where: { $0.resultSource != nil }) else { return first }
        // Results that refer to others are assembled from rows (and bodies) of one snapshot.
        return try readers.snapshot { db in
            var nodes = try read(db)
            try PGRows.assemble(&nodes, jobID: jobID, db: db)
            return nodes
        }
    }

    public func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        let read = { (db: PostgresConnection) throws -> NodeRecord? in
            let rows = try db.run(
                prepared: "node", "SELECT \(PGRows.node) FROM nodes WHERE job_id = $1 AND id = $2",
                [.text(jobID), .text(nodeID)])
            return try PGRows.rows(rows).first.map(PGRows.node)
        }
        let first = try readers.with(read)
        guard let found = first, found.resultSource != nil else { return first }
        return try readers.snapshot { db in
            guard var node = try read(db) else { return nil }
            try PGRows.assembleResult(of: &node, db: db)
            return node
        }
    }

    public func body(jobID: String, nodeID: String) throws -> StoredBody? {
        try readers.with { db in
            let rows = try db.run(
                prepared: "body", "SELECT content_type, bytes FROM bodies WHERE job_id = $1 AND node_id = $2",
                [.text(jobID), .text(nodeID)])
            guard let row = PGRows.rows(rows).first else { return nil }
            guard let hex = row.string(1), let bytes = PostgresRows.bytes(fromHex: hex) else {
                throw StoreError(.corrupt, "stored body of \(jobID)/\(nodeID) is not bytea")
            }
            return StoredBody(contentType: row.string(0), bytes: bytes)
        }
    }

    /// The states of a job still to run, as an SQL list.
    static let unfinished = "('\(NodeState.pending.rawValue)', '\(NodeState.running.rawValue)')"

    /// The unfinished jobs this server may run: those no live server holds (their lease expired, or was given up)
    /// are claimed first, all at once; jobs other servers hold are not returned.
    public func unfinishedJobs(unreadable: inout [UnreadableJob]) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        let claimed: [String: Int64] = try readers.with { db in
            let rows = try db.query(
                "WITH c AS (SELECT id FROM jobs WHERE state IN \(Self.unfinished) AND due_at IS NULL "
                    + "AND (lease_expires_at IS NULL OR lease_expires_at < \(PostgresLeases.nowMs) OR lease_owner = $1) "
                    + "FOR UPDATE SKIP LOCKED) UPDATE jobs j SET lease_owner = $1, lease_generation = j.lease_generation + 1, "
                    + "lease_expires_at = \(PostgresLeases.nowMs) + $2 FROM c WHERE j.id = c.id RETURNING j.id, j.lease_generation",
                [.text(leases.owner), .int(leases.ttlMs)])
            var claimed: [String: Int64] = [:]
            for row in PGRows.rows(rows) { if let id = row.string(0) { claimed[id] = row.int64(1) } }
            return claimed
        }
        leases.own(claimed)
        if claimed.isEmpty { return [] }
        return try readers.with { db in try Self.loadJobs(Array(claimed.keys), db, unreadable: &unreadable) }
    }

    /// The jobs of `ids` that are unfinished, oldest first, with their nodes; in one snapshot.
    static func loadJobs(
        _ ids: [String], _ db: PostgresConnection, unreadable: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        var skipped: [UnreadableJob] = []
        defer { unreadable.append(contentsOf: skipped) }
        let idList = PostgresLeases.array(ids)
        return try db.inReadSnapshot { try loadJobsInSnapshot(idList, db, skipped: &skipped) }
    }

    private static func loadJobsInSnapshot(
        _ idList: PostgresParameter, _ db: PostgresConnection, skipped: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        do {
            let jobRows = PGRows.rows(
                try db.query(
                    "SELECT \(PGRows.job) FROM jobs WHERE state IN \(Self.unfinished) AND due_at IS NULL "
                        + "AND id = ANY($1::text[]) ORDER BY id", [idList]))
            var jobs: [JobRecord] = []
            for row in jobRows {
                do {
                    jobs.append(try PGRows.job(row))
                } catch let error as StoreError {
                    if let partial = PGRows.partialJob(row) { skipped.append(UnreadableJob(job: partial, error: error)) }
                }
            }
            if jobs.isEmpty { return [] }
            let nodeRows = PGRows.rows(
                try db.query(
                    "SELECT \(PGRows.prefixed("n", PGRows.node)) FROM jobs j JOIN nodes n ON n.job_id = j.id "
                        + "WHERE j.state IN \(Self.unfinished) AND j.due_at IS NULL AND j.id = ANY($1::text[]) "
                        + "ORDER BY n.job_id, n.position", [idList]))
            var byJob: [String: [NodeRecord]] = [:]
            var badNodes: [String: StoreError] = [:]
            for row in nodeRows {
                do {
                    let node = try PGRows.node(row)
                    byJob[node.jobID, default: []].append(node)
                } catch let error as StoreError {
                    if let jobID = row.string(0) { badNodes[jobID] = error }
                }
            }
            return try ResultAssembly.loaded(jobs, nodes: &byJob, badNodes: badNodes, skipped: &skipped) { jobID, ids in
                try PGRows.bodies(jobID: jobID, nodeIDs: ids, db: db)
            }
        }
    }

    /// Only of jobs no live server holds: another server may still run a settled job's left-over nodes.
    public func unsettledNodesOfSettledJobs() throws -> [NodeRecord] {
        try readers.with { db in
            let rows = try db.query(
                "SELECT \(PGRows.prefixed("n", PGRows.node)) FROM jobs j JOIN nodes n ON n.job_id = j.id "
                    + "WHERE j.state NOT IN \(Self.unfinished) AND (j.p_pending > 0 OR j.p_running > 0) "
                    + "AND n.state IN \(Self.unfinished) AND (j.lease_owner IS NULL OR j.lease_owner = $1 "
                    + "OR j.lease_expires_at IS NULL OR j.lease_expires_at < \(PostgresLeases.nowMs)) "
                    + "ORDER BY n.job_id, n.position", [.text(leases.owner)])
            // A node that cannot be read cannot be repaired either; the others still are.
            return PGRows.rows(rows).compactMap { try? PGRows.node($0) }
        }
    }

    public func jobCounts() throws -> [NodeState: Int] {
        try readers.with { db in
            var counts: [NodeState: Int] = [:]
            for state in NodeState.allCases { counts[state] = 0 }
            for row in PGRows.rows(try db.execute("SELECT state, count(*) FROM jobs GROUP BY state")) {
                counts[try PGRows.state(row, 0)] = row.int(1)
            }
            return counts
        }
    }

    public func settledJobCounts(finishedBeforeMs: Int64) throws -> [NodeState: Int] {
        try readers.with { db in
            let rows = try db.run(
                prepared: "settled_counts",
                "SELECT state, count(*) FROM jobs WHERE finished_at < $1 AND state NOT IN \(Self.unfinished) GROUP BY state",
                [.int(finishedBeforeMs)])
            var counts: [NodeState: Int] = [:]
            for row in PGRows.rows(rows) { counts[try PGRows.state(row, 0)] = row.int(1) }
            return counts
        }
    }

    public func dueJobs(
        atOrBeforeMs: Int64, after: (dueAt: Int64, id: String)?, limit: Int, maxNodes: Int, skipping: (String) -> Bool,
        unreadable: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        var skipped: [UnreadableJob] = []
        defer { unreadable.append(contentsOf: skipped) }
        // Every server's timekeeper finds the same due jobs: each is taken by one of them (its lease), and the
        // others skip it, so that it starts once.
        let claimed: [String: Int64] = try readers.with { db in
            let rows = try db.run(
                prepared: "due_claim",
                "WITH c AS (SELECT id FROM jobs WHERE due_at IS NOT NULL AND due_at <= $1 "
                    + "AND (due_at > $3 OR (due_at = $3 AND id > $4)) AND (lease_owner IS NULL "
                    + "OR lease_expires_at IS NULL OR lease_expires_at < \(PostgresLeases.nowMs)) "
                    + "ORDER BY due_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) "
                    + "UPDATE jobs j SET lease_owner = $5, lease_generation = j.lease_generation + 1, "
                    + "lease_expires_at = \(PostgresLeases.nowMs) + $6 FROM c WHERE j.id = c.id "
                    + "RETURNING j.id, j.lease_generation",
                [.int(atOrBeforeMs), .int(max(1, limit)), .int(after?.dueAt ?? Int64.min), .text(after?.id ?? ""),
                 .text(leases.owner), .int(leases.ttlMs)])
            var claimed: [String: Int64] = [:]
            for row in PGRows.rows(rows) { if let id = row.string(0) { claimed[id] = row.int64(1) } }
            return claimed
        }
        leases.own(claimed)
        return try readers.snapshot { db in
            let jobRows = PGRows.rows(
                try db.run(
                    prepared: "due_jobs",
                    "SELECT \(PGRows.job) FROM jobs WHERE due_at IS NOT NULL AND due_at <= $1 "
                        + "AND (due_at > $3 OR (due_at = $3 AND id > $4)) AND lease_owner = $5 ORDER BY due_at, id LIMIT $2",
                    [.int(atOrBeforeMs), .int(max(1, limit)), .int(after?.dueAt ?? Int64.min), .text(after?.id ?? ""),
                     .text(leases.owner)]))
            var found: [(job: JobRecord, nodes: [NodeRecord])] = []
            var nodesRead = 0
            for row in jobRows {
                if nodesRead > maxNodes { break }
                let job: JobRecord
                do {
                    job = try PGRows.job(row)
                } catch let error as StoreError {
                    if let partial = PGRows.partialJob(row) { skipped.append(UnreadableJob(job: partial, error: error)) }
                    continue
                }
                if skipping(job.id) {
                    found.append((job, []))
                    continue
                }
                do {
                    let nodeRows = try db.run(
                        prepared: "nodes_true", "SELECT \(PGRows.node) FROM nodes WHERE job_id = $1 ORDER BY position",
                        [.text(job.id)])
                    var nodes = try PGRows.rows(nodeRows).map(PGRows.node)
                    // A retried job that waits for its time keeps its succeeded nodes, with their whole results.
                    var assembled = job
                    try PGRows.assemble(&nodes, jobID: job.id, db: db)
                    try ResultAssembly.assemble(&assembled, nodes: nodes)
                    nodesRead += nodes.count
                    found.append((assembled, nodes))
                } catch let error as StoreError where error.kind == .corrupt {
                    skipped.append(UnreadableJob(job: job, error: error))
                }
            }
            return found
        }
    }

    public func nextDueAt(after afterMs: Int64) throws -> Int64? {
        try readers.with { db in
            let rows = try db.run(prepared: "next_due", "SELECT min(due_at) FROM jobs WHERE due_at > $1", [.int(afterMs)])
            return PGRows.rows(rows).first?.optionalInt64(0)
        }
    }

    public func scheduledJobCount() throws -> Int {
        try readers.with { db in
            PGRows.rows(try db.execute("SELECT count(*) FROM jobs WHERE due_at IS NOT NULL")).first?.int(0) ?? 0
        }
    }

    public func mapExpansions(jobID: String) throws -> [MapExpansionRecord] {
        try readers.with { db in
            let rows = try db.run(
                prepared: "map_items",
                "SELECT node_id, first_position, items FROM map_items WHERE job_id = $1 ORDER BY first_position",
                [.text(jobID)])
            return try PGRows.rows(rows).map { row in
                guard let nodeID = row.string(0) else { throw StoreError(.corrupt, "map items without a node id") }
                return MapExpansionRecord(
                    jobID: jobID, nodeID: nodeID, firstPosition: row.int(1), items: try row.json(2) ?? .array([]),
                    nodes: [])
            }
        }
    }
}

// MARK: - Reader connections

/// The reader connections, each handed to one thread at a time.
final class PostgresReaderPool: Sendable {
    private let connections: IdleConnections<PostgresConnection>

    init(url: String) {
        connections = IdleConnections(
            open: {
                do {
                    return try PostgresConnection(url: url)
                } catch let error as StoreError {
                    // Reads of an unreachable server are a resource failure (503), as the writer's are.
                    throw StoreError(.unavailable, error.message)
                }
            },
            close: { $0.close() })
    }

    /// `body` on a borrowed connection; one that lost the server is closed rather than kept.
    func with<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        let connection = try connections.borrow()
        var healthy = true
        defer { connections.giveBack(connection, reusable: healthy) }
        do {
            return try body(connection)
        } catch let error as StoreError {
            if error.kind == .unavailable { healthy = false }
            throw error
        }
    }

    /// `body` in one read-only snapshot.
    func snapshot<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        try with { db in try db.inReadSnapshot { try body(db) } }
    }

    func close() { connections.close() }
}

extension PostgresJobStore: SharedKeyAdmission {
    func requestKeyAdmission(_ keys: Set<String>) { keyAdmission.request(keys) }

    func admitNow(_ key: String) throws -> (holders: [String], waiting: [String]) { try keyAdmission.pass(key) }

    func queuePosition(jobID: String) throws -> Int? { try keyAdmission.queuePosition(jobID: jobID) }

    func queuePositions(jobIDs: [String]) throws -> [String: Int] { try keyAdmission.queuePositions(jobIDs) }

    var keyAdmissionPasses: Int { keyAdmission.passes }
}
