#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Threads

/// The `JobStore` on one SQLite file in WAL mode.
///
/// **Writes.** One writer thread owns the only writing connection. Every write —
/// `createJob`, `enqueue`d changes, deletes, sweeps — is queued to it; it takes
/// everything queued at once and commits it in one transaction (group commit)
/// with cached prepared statements. Callers that need an answer (`createJob`,
/// `deleteJob`, `sweep`, `flush`) wait for the commit that includes their rows,
/// so concurrent submissions share one transaction and one fsync.
///
/// **Durability.** The file runs `synchronous=NORMAL`: in WAL mode a commit is
/// then written to the WAL but fsynced only at checkpoints, which survives a
/// crash or `kill -9` of the process (the OS holds the pages) but not a power
/// failure or kernel crash. That is the contract for state changes, which the
/// engine can redo after a restart. A batch containing a `createJob` is
/// committed with `synchronous=FULL` instead — the WAL is fsynced before the
/// commit returns — because a `201` promises the job survives anything. That
/// fsync also flushes what was committed since the last checkpoint, so the
/// writer checkpoints once it has been idle for a moment (`checkpointWhileIdle`).
///
/// **Failures.** A write that fails for lack of a resource (disk full, I/O
/// error, lock, descriptors: `StoreError.isResourceFailure`) loses nothing: the
/// state changes are kept — the latest record of each job and node — and retried
/// with a doubling delay (50 ms to 5 s) until they commit. Meanwhile the store is
/// degraded (`health`): submissions, deletes and flushes are refused at once with
/// that failure or kind `unavailable`, and the first commit ends it.
///
/// **Reads** use a small pool of their own connections; in WAL mode they read
/// the last committed snapshot and never wait for the writer.
public final class SQLiteJobStore: JobStore, @unchecked Sendable {
    // @unchecked: `closed` is read and written only with `closeMonitor` held; the other properties are immutable
    // references to types that are safe to share (each proves it at its declaration).
    /// The database file.
    public let path: String

    private let logger: Logger
    private let queue: WriteQueue
    let readers: ReaderPool
    private let writerThread: StoreThread
    private let writerStatus: WriterStatus
    private let closeMonitor = StoreMonitor()
    private var closed = false

    /// Opens (creating the file and its folder) and migrates.
    /// - Throws: `StoreError` of kind `open` or `migrate`.
    public convenience init(path: String, logger: Logger = .disabled) throws {
        try self.init(path: path, logger: logger, busyTimeoutMs: 5000)
    }

    /// As `init(path:logger:)`; the writer waits at most `busyTimeoutMs` for a
    /// write lock held by another process (only tests lower it).
    init(path: String, logger: Logger, busyTimeoutMs: Int32) throws {
        self.path = path
        self.logger = logger
        // Readers open the file again on their own connections, so it must be a real file.
        if path.isEmpty || path.hasPrefix(":memory:") || path.hasPrefix("file:") {
            throw StoreError(.open, "the store needs a file path, not \"\(path)\"")
        }
        try SQLiteJobStore.makeParentDirectory(of: path)
        let connection = try SQLiteConnection(path: path, create: true, busyTimeoutMs: busyTimeoutMs)
        do {
            try SQLiteJobStore.configureWriter(connection)
            try StoreSchema.migrate(connection, logger: logger)
        } catch let error as StoreError {
            connection.close()
            throw error
        }
        let queue = WriteQueue()
        let writer = StoreWriter(connection: connection, logger: logger)
        self.queue = queue
        self.writerStatus = writer.status
        self.readers = ReaderPool(path: path)
        // The thread holds the writer and the queue, not the store, so that
        // dropping the last reference to the store still closes it.
        self.writerThread = try StoreThread(name: "store-writer", niceIncrement: StoreThread.writerNiceIncrement) {
            writer.run(queue)
        }
        logger.debug("store opened", ["path": .string(path)])
    }

    deinit { close() }

    /// Waits until the writer has copied everything committed from the WAL into the database file, which it does
    /// once nothing has been queued for `StoreWriter.idleCheckpointMs` (tests); false if that took longer than
    /// `milliseconds`.
    func waitUntilWALCopied(milliseconds: Int64) -> Bool {
        writerStatus.waitUntilWALCopied(milliseconds: milliseconds)
    }

    // MARK: Writes

    /// Hands the job's row to the writer and waits for the (fsynced) commit that includes it.
    ///
    /// With `nodesMayFollow` (the engine's job that starts now) the job is answered once its row is committed, and
    /// its node rows go in with the writer's next commit: they are queued before this returns, so before any
    /// change made to them after it, and they say nothing the job's stored request does not. A submission of
    /// 10,000 fetches then starts its fetches as much sooner as inserting 10,000 rows takes.
    public func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?, nodesMayFollow: Bool,
        completion: @escaping @Sendable (Result<CreateOutcome, StoreError>) -> Void
    ) {
        let nodesFollow = nodesMayFollow && !nodes.isEmpty
        let request = CreateRequest(
            job: job, nodes: nodesFollow ? [] : nodes, idempotencyKey: idempotencyKey, requestHash: requestHash)
        queue.push(answering: { [self] result in
            // On the writer, after the commit: the rows are queued before anyone hears of the job, so before any
            // change to them.
            if nodesFollow, case .success(.created) = result { enqueue(unstoredNodes: nodes) }
            completion(result)
        }) { .create(request, $0) }
    }

    public func enqueue(unstoredNodes nodes: [NodeRecord]) {
        queue.push(Changes.unstoredRows(nodes), logger: logger)
    }

    /// Queues the changes for the writer's next batch; only the last record of a job or node in a batch is written,
    /// and changes the disk refuses are kept and retried until they commit.
    public func enqueue(
        jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)], urgent: Bool
    ) {
        queue.push(Changes(jobs: jobs, nodes: nodes, bodies: bodies, urgent: urgent), logger: logger)
    }

    /// Calls `completion` on the writer thread once everything queued before this call is committed
    /// (or could not be); never blocks.
    public func flush(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        queue.push(answering: completion) { .barrier($0) }
    }

    /// Inserts a map's items, after everything queued before; `completion` runs on the store's thread once that is
    /// committed, or with the error that kept it from being. The copies' rows wait for their first change, as a new
    /// job's do (`PendingChanges.unchanged`): queued before the items, so before any change made to a copy, they say
    /// nothing the items do not, and `Engine.rebuild` makes them again from the items. A map of 1,000 copies then
    /// starts them as much sooner as inserting 1,000 rows takes.
    /// If the items cannot be committed, their copies' rows waiting so are dropped: without the items a restart
    /// could not line them up with the graph.
    public func expandMap(_ expansion: MapExpansionRecord, _ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        enqueue(unstoredNodes: expansion.nodes)
        queue.push(answering: completion) { .expand(expansion, $0) }
    }

    /// The expansions of a job's maps, in the order they were made (their copies' first position).
    public func mapExpansions(jobID: String) throws -> [MapExpansionRecord] {
        try readers.with { db in
            let statement = try db.prepare(
                "SELECT node_id, first_position, items FROM map_items WHERE job_id = ?1 ORDER BY first_position")
            defer { statement.reset() }
            statement.bind(1, jobID)
            var out: [MapExpansionRecord] = []
            while try statement.step() {
                guard let nodeID = statement.string(0) else { throw StoreError(.corrupt, "map items without a node id") }
                out.append(
                    MapExpansionRecord(
                        jobID: jobID, nodeID: nodeID, firstPosition: statement.int(1),
                        items: try statement.json(2, maxDepth: Rows.maxJSONDepth) ?? .array([]), nodes: []))
            }
            return out
        }
    }

    /// Calls `completion` on the writer thread once everything queued before this call is committed, through any
    /// number of retries.
    public func whenCommitted(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
        queue.push(answering: completion) { .committed($0) }
    }

    /// How the writer is doing, as it last published.
    public var health: StoreHealth { writerStatus.health }

    public func waitForHealth(milliseconds: Int64, until accept: (StoreHealth) -> Bool) -> Bool {
        writerStatus.wait(milliseconds: milliseconds, until: accept)
    }

    /// Deletes the job, its nodes and its bodies in one transaction of the writer.
    public func deleteJob(id: String, _ completion: @escaping @Sendable (Result<Bool, StoreError>) -> Void) {
        queue.push(answering: completion) { .delete(id, $0) }
    }

    /// Deletes settled jobs finished before `finishedBeforeMs`, 500 per transaction.
    public func sweep(finishedBeforeMs: Int64) throws -> Int {
        try queue.sweep(finishedBeforeMs: finishedBeforeMs)
    }

    /// Writes what is queued, stops the writer and closes every connection; calling it again does nothing.
    public func close() {
        closeMonitor.lock()
        let wasClosed = closed
        closed = true
        closeMonitor.unlock()
        if wasClosed { return }
        queue.close()
        writerThread.join()
        readers.close()
        logger.debug("store closed", ["path": .string(path)])
    }

    // MARK: Reads

    /// Reads the job on a reader connection; a result that refers to its root's is assembled from the node rows
    /// of the same snapshot.
    public func job(id: String) throws -> JobRecord? {
        try readJob(id: id, columns: Columns.job)
    }

    /// Reads the job without its `request` column.
    public func jobWithoutRequest(id: String) throws -> JobRecord? {
        try readJob(id: id, columns: Columns.shownJob)
    }

    public func showStoredJob<T>(id: String, _ make: (JobRecord, StoredResultText) throws -> T) throws -> StoredJobShown<T> {
        try inReadTransaction { db in
            guard var job = try Self.jobRow(id: id, columns: Columns.shownJob, db: db) else { return .notFound }
            guard job.state.isSettled, job.resultSource == .child(0) else {
                try Rows.assembleResult(of: &job, db: db)
                return .record(job)
            }
            // Read and written in this transaction: the rows, then each body as its fetch's result is written.
            return .shown(job, try make(job, try Rows.resultText(jobID: id, db: db)))
        }
    }

    public func showStoredNodeList<T>(
        jobID: String, _ make: (StoredNodeListText) throws -> T
    ) throws -> StoredNodeListShown<T> {
        try inReadTransaction { db in
            guard let state = try Self.jobRow(id: jobID, columns: Columns.listedJob, db: db)?.state else { return .notFound }
            guard state.isSettled else { return .nodes(state, try Rows.nodesWithResults(jobID: jobID, db: db)) }
            // Read and written in this transaction: the rows, then each body as a result that holds it is written.
            return .shown(try make(try Rows.nodeListText(jobID: jobID, db: db)))
        }
    }

    private func readJob(id: String, columns: String) throws -> JobRecord? {
        try inReadTransaction { db in
            guard var job = try Self.jobRow(id: id, columns: columns, db: db) else { return nil }
            try Rows.assembleResult(of: &job, db: db)
            return job
        }
    }

    /// `body` with a reader connection, in one read transaction (one snapshot of the file).
    private func inReadTransaction<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try readers.with { db in
            try db.execute("BEGIN")
            defer { try? db.execute("COMMIT") }
            return try body(db)
        }
    }

    /// The job's row, its `columns` as `Columns.job` names them, or `nil`.
    private static func jobRow(id: String, columns: String, db: SQLiteConnection) throws -> JobRecord? {
        let statement = try db.prepare("SELECT \(columns) FROM jobs WHERE id = ?1")
        defer { statement.reset() }
        statement.bind(1, id)
        return try statement.step() ? try Rows.job(statement) : nil
    }

    /// Reads the `version` column from the primary key's row.
    public func jobVersion(id: String) throws -> Int64? {
        try jobColumn("version", id: id) { $0.int64(0) }
    }

    /// Reads the `p_total` column from the primary key's row.
    public func nodeCount(id: String) throws -> Int? {
        try jobColumn("p_total", id: id) { $0.int(0) }
    }

    /// Reads the `state` column from the primary key's row.
    public func jobState(id: String) throws -> NodeState? {
        try jobColumn("state", id: id) { statement in
            guard let text = statement.string(0), let state = NodeState(rawValue: text) else {
                throw StoreError(.corrupt, "unknown job state \(statement.string(0) ?? "NULL")")
            }
            return state
        }
    }

    /// One column of the job's row, as `read` takes it from the statement; `nil` when there is no such job.
    private func jobColumn<T>(_ column: String, id: String, _ read: (SQLiteStatement) throws -> T) throws -> T? {
        try readers.with { db in
            let statement = try db.prepare("SELECT \(column) FROM jobs WHERE id = ?1")
            defer { statement.reset() }
            statement.bind(1, id)
            guard try statement.step() else { return nil }
            return try read(statement)
        }
    }

    /// Reads one page, newest first, without `result` and `request`.
    public func listJobs(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage {
        let after = try cursor.map(JobCursor.decode)
        guard limit > 0 else { return JobPage(jobs: [], nextCursor: nil) }
        var sql = "SELECT \(Columns.listedJob) FROM jobs"
        switch (state != nil, after != nil) {
        case (false, false): break
        case (true, false): sql += " WHERE state = ?1"
        case (false, true): sql += " WHERE id < ?2"
        case (true, true): sql += " WHERE state = ?1 AND id < ?2"
        }
        sql += " ORDER BY id DESC LIMIT ?3"
        return try readers.with { db in
            let statement = try db.prepare(sql)
            defer { statement.reset() }
            if let state { statement.bind(1, state.rawValue) }
            if let after { statement.bind(2, after) }
            statement.bind(3, Int64(min(limit, Int(Int32.max))) + 1)
            var jobs: [JobRecord] = []
            jobs.reserveCapacity(min(limit, 512))
            while try statement.step() {
                if jobs.count == limit {
                    return JobPage(jobs: jobs, nextCursor: jobs.last.map { JobCursor.encode($0.id) })
                }
                jobs.append(try Rows.job(statement))
            }
            return JobPage(jobs: jobs, nextCursor: nil)
        }
    }

    /// Reads a job's nodes in position order; with results, those that refer to others are assembled from the
    /// rows of the same snapshot.
    public func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord] {
        guard includeResults else {
            return try readers.with { db in
                try Rows.storedNodes(jobID: jobID, from: 0, columns: Columns.nodeWithoutResult, db: db)
            }
        }
        return try inReadTransaction { db in try Rows.nodesWithResults(jobID: jobID, db: db) }
    }

    /// Reads one node with its result (assembled from its subtree's rows when it refers to them).
    public func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        try readers.with { db in
            try db.execute("BEGIN")
            defer { try? db.execute("COMMIT") }
            let statement = try db.prepare("SELECT \(Columns.node) FROM nodes WHERE job_id = ?1 AND id = ?2")
            let found: NodeRecord?
            do {
                defer { statement.reset() }
                statement.bind(1, jobID)
                statement.bind(2, nodeID)
                found = try statement.step() ? try Rows.node(statement) : nil
            }
            guard var node = found else { return nil }
            try Rows.assembleResult(of: &node, db: db)
            return node
        }
    }

    /// Reads a stored response body.
    public func body(jobID: String, nodeID: String) throws -> StoredBody? {
        try readers.with { db in
            let statement = try db.prepare("SELECT content_type, bytes FROM bodies WHERE job_id = ?1 AND node_id = ?2")
            defer { statement.reset() }
            statement.bind(1, jobID)
            statement.bind(2, nodeID)
            guard try statement.step() else { return nil }
            return StoredBody(contentType: statement.string(0), bytes: statement.blob(1) ?? [])
        }
    }

    /// Reads pending and running jobs and all their nodes with two queries in one snapshot; a job whose row
    /// or nodes cannot be read is left out and described in `unreadable`.
    public func unfinishedJobs(unreadable: inout [UnreadableJob]) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        var skipped: [UnreadableJob] = []
        defer { unreadable.append(contentsOf: skipped) }
        return try readers.with { db in
            // One read transaction: jobs and nodes from the same snapshot.
            try db.execute("BEGIN")
            defer { try? db.execute("COMMIT") }
            let unfinished = "('\(NodeState.pending.rawValue)', '\(NodeState.running.rawValue)')"
            let jobStatement = try db.prepare("SELECT \(Columns.job) FROM jobs WHERE state IN \(unfinished) AND due_at IS NULL ORDER BY id")
            defer { jobStatement.reset() }
            let jobs = try Rows.jobs(stepping: jobStatement, skipped: &skipped)
            if jobs.isEmpty { return [] }

            let nodeStatement = try db.prepare(
                "SELECT \(Columns.prefixed("n", Columns.node)) FROM jobs j JOIN nodes n ON n.job_id = j.id WHERE j.state IN \(unfinished) AND j.due_at IS NULL")
            defer { nodeStatement.reset() }
            var byJob: [String: [NodeRecord]] = [:]
            byJob.reserveCapacity(jobs.count)
            var badNodes: [String: StoreError] = [:]
            while try nodeStatement.step() {
                do {
                    let node = try Rows.node(nodeStatement)
                    byJob[node.jobID, default: []].append(node)
                } catch let error as StoreError {
                    if let jobID = nodeStatement.string(0) { badNodes[jobID] = error }
                }
            }
            return try ResultAssembly.loaded(jobs, nodes: &byJob, badNodes: badNodes, skipped: &skipped) { jobID, ids in
                try Rows.bodies(jobID: jobID, nodeIDs: ids, db: db)
            }
        }
    }

    /// Reads the nodes still pending or running in settled jobs, with one query over the jobs whose progress
    /// says some are (a node's state and its job's progress are written in the same transaction).
    public func unsettledNodesOfSettledJobs() throws -> [NodeRecord] {
        try readers.with { db in
            let unfinished = "('\(NodeState.pending.rawValue)', '\(NodeState.running.rawValue)')"
            let statement = try db.prepare(
                "SELECT \(Columns.prefixed("n", Columns.node)) FROM jobs j JOIN nodes n ON n.job_id = j.id "
                    + "WHERE j.state NOT IN \(unfinished) AND (j.p_pending > 0 OR j.p_running > 0) AND n.state IN \(unfinished) "
                    + "ORDER BY n.job_id, n.position")
            defer { statement.reset() }
            var nodes: [NodeRecord] = []
            while try statement.step() {
                // A node that cannot be read cannot be repaired either; the others still are.
                if let node = try? Rows.node(statement) { nodes.append(node) }
            }
            return nodes
        }
    }

    /// Counts jobs by state from the state index.
    public func jobCounts() throws -> [NodeState: Int] {
        try readers.with { db in
            let statement = try db.prepare("SELECT state, count(*) FROM jobs GROUP BY state")
            defer { statement.reset() }
            var counts: [NodeState: Int] = [:]
            for state in NodeState.allCases { counts[state] = 0 }
            while try statement.step() {
                guard let text = statement.string(0), let state = NodeState(rawValue: text) else {
                    throw StoreError(.corrupt, "unknown job state \(statement.string(0) ?? "NULL")")
                }
                counts[state] = statement.int(1)
            }
            return counts
        }
    }

    /// Counts from the `finished_at` index, as the sweep selects.
    public func settledJobCounts(finishedBeforeMs: Int64) throws -> [NodeState: Int] {
        try readers.with { db in
            let statement = try db.prepare(
                "SELECT state, count(*) FROM jobs WHERE finished_at < ?1 AND state NOT IN ('\(NodeState.pending.rawValue)', "
                    + "'\(NodeState.running.rawValue)') GROUP BY state")
            defer { statement.reset() }
            statement.bind(1, finishedBeforeMs)
            var counts: [NodeState: Int] = [:]
            while try statement.step() {
                guard let text = statement.string(0), let state = NodeState(rawValue: text) else {
                    throw StoreError(.corrupt, "unknown job state \(statement.string(0) ?? "NULL")")
                }
                counts[state] = statement.int(1)
            }
            return counts
        }
    }

    // MARK: Opening

    private static func configureWriter(_ connection: SQLiteConnection) throws {
        let mode = try connection.prepare("PRAGMA journal_mode = WAL")
        defer { mode.reset() }
        guard try mode.step(), mode.string(0)?.lowercased() == "wal" else {
            throw StoreError(.open, "cannot switch the database to WAL mode")
        }
        mode.reset()
        // 16 MiB of page cache for the writer (SQLite's default is 2 MiB): every update of a job row written before
        // schema version 9 reads the overflow pages of its submitted request back to compare them, and with one of
        // 11 MB (100,000 fetches) the default cache sent each batch back to the file for them (40 ms a batch, 8.5 ms
        // with this).
        try connection.execute("""
            PRAGMA synchronous = NORMAL;
            PRAGMA journal_size_limit = \(StoreWriter.walLimitBytes);
            PRAGMA temp_store = MEMORY;
            PRAGMA cache_size = -16384;
            """)
    }

    /// `mkdir -p` of the folder holding `path`.
    private static func makeParentDirectory(of path: String) throws {
        guard let slash = path.lastIndex(of: "/") else { return }
        let folder = String(path[..<slash])
        if folder.isEmpty { return }
        var prefix = folder.hasPrefix("/") ? "/" : ""
        for part in folder.split(separator: "/") {
            prefix += part
            if mkdir(prefix, 0o755) != 0 && errno != EEXIST {
                throw StoreError(.open, "cannot create folder \(prefix): errno \(errno)")
            }
            prefix += "/"
        }
    }
}

// MARK: - Queued writes

struct CreateRequest {
    var job: JobRecord
    var nodes: [NodeRecord]
    var idempotencyKey: String?
    var requestHash: String?
}

struct BodyChange {
    var jobID: String
    var nodeID: String
    var body: StoredBody
}

struct Changes {
    var jobs: [JobRecord]
    var nodes: [NodeRecord]
    var bodies: [BodyChange]
    /// Node rows not stored yet, inserted rather than updated (`JobStore.enqueue(unstoredNodes:)`).
    var unstoredNodes: [NodeRecord] = []
    /// To be written as soon as the writer can, not on idle CPU time (`JobStore.enqueue(jobs:nodes:bodies:urgent:)`):
    /// said so, or a job settles.
    let urgent: Bool

    init(
        jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)],
        unstoredNodes: [NodeRecord] = [], urgent: Bool = false
    ) {
        self.jobs = jobs
        self.nodes = nodes
        self.bodies = bodies.map { BodyChange(jobID: $0.jobID, nodeID: $0.nodeID, body: $0.body) }
        self.unstoredNodes = unstoredNodes
        self.urgent = urgent || jobs.contains { $0.state.isSettled }
    }

    /// New node rows, to be inserted (`JobStore.enqueue(unstoredNodes:)`). Many are urgent, taken at once rather
    /// than on idle CPU time: they wait as a few words each in the writer's table (`PendingChanges.unchanged`), but
    /// as whole records in the queue, 20 MB for a job of 100,000 fetches, which an idle writer found no CPU time to
    /// take while the job ran.
    static func unstoredRows(_ nodes: [NodeRecord]) -> Changes {
        Changes(jobs: [], nodes: [], bodies: [], unstoredNodes: nodes, urgent: nodes.count >= WriteQueue.absorbedRecords)
    }

    var isEmpty: Bool { jobs.isEmpty && nodes.isEmpty && bodies.isEmpty && unstoredNodes.isEmpty }
    /// Records carried (jobs, nodes and bodies).
    var count: Int { jobs.count + nodes.count + bodies.count + unstoredNodes.count }
}

enum WriteOp {
    case create(CreateRequest, WriteTicket<CreateOutcome>)
    case changes(Changes)
    case delete(String, WriteTicket<Bool>)
    case sweep(before: Int64, limit: Int, WriteTicket<Int>)
    /// Answered once everything queued before it is committed, or with the failure that kept it from being.
    case barrier(WriteTicket<Void>)
    /// Answered once everything queued before it is committed, however many retries that takes.
    case committed(WriteTicket<Void>)
    /// A map's copies and items, inserted in one transaction (API.md §7.1).
    case expand(MapExpansionRecord, WriteTicket<Void>)

    var needsFullSync: Bool {
        if case .create = self { return true }
        return false
    }
}

/// The writer's inbox. Only the writer thread waits on it.
final class WriteQueue: @unchecked Sendable {
    // @unchecked: every `var` is read and written only with `monitor` held.
    private let monitor = StoreMonitor()
    private var ops: [WriteOp] = []
    private var closed = false
    /// Whether an op queued since the last `take` is one somebody waits on (anything but state changes).
    private var awaited = false
    /// Whether state changes queued since the last `take` are urgent (`Changes.urgent`).
    private var urgent = false
    /// The writer's thread (`currentThreadID()`), once it has said it may go to idle priority and back
    /// (`writerStarted`). It then holds state changes alone, which nobody waits for, and writes them at idle priority
    /// (`IdlePriority`), taking only CPU time the fetcher, the engine and the event loops leave. It is raised back to
    /// its own priority, and writes what it holds, as soon as an op somebody waits on is queued (a submission's
    /// commit, a flush, a delete), urgent changes come (a job settles, a fetch that may not be repeated ends), or the
    /// first state change held has waited `maxIdleLagMs` (`gatherUntil`). That bounds what the queue holds, and what
    /// a crash makes the server do again: idempotent fetches that ended in those last seconds.
    private var idleWriter: Int32?
    /// Whether the writer is at idle priority now.
    private var writerIsIdle = false
    /// When the first op since the last `take` was queued (monotonic ms); only kept with an `idleWriter`.
    private var queuedSinceMs: Int64 = 0
    /// How long a state change may wait while the writer is at idle priority (set by tests).
    var maxIdleLagMs: Int64 {
        get { monitor.withLock { lagMs } }
        set { monitor.withLock { lagMs = newValue } }
    }
    private var lagMs: Int64 = 10_000
    /// Records in the state changes queued since the writer last took them or merged them (`absorbing`).
    private var queuedRecords = 0
    /// Whether the writer holds state changes it merged while gathering (`absorbing`) and has not written: the lag
    /// then still counts from the first of them.
    private var holding = false
    /// How many records of state changes the queue holds, while the writer gathers, before the writer merges them
    /// into what it will write (`absorbing`). Queued as they come, a job's changes are one record per change: the
    /// 100,000 fetches of one job were 200,000 records (40 MB) in the queue until it settled, and then as many again
    /// in the writer's table, one per node.
    static let absorbedRecords = 4_096

    /// Queues state changes; once the queue is closed they are dropped, with a warning.
    func push(_ changes: Changes, logger: Logger) {
        if changes.isEmpty { return }
        if !push(.changes(changes)) {
            logger.warning("store is closed; state changes dropped", [
                "jobs": .int(changes.jobs.count), "nodes": .int(changes.nodes.count + changes.unstoredNodes.count),
            ])
        }
    }

    /// Queues the op `makeOp` builds around a ticket answered through `completion`, on the writer's thread; once the
    /// queue is closed, `completion` is told so at once.
    func push<Value>(
        answering completion: @escaping @Sendable (Result<Value, StoreError>) -> Void,
        _ makeOp: (WriteTicket<Value>) -> WriteOp
    ) {
        if !push(makeOp(WriteTicket(onComplete: completion))) {
            completion(.failure(StoreError(.closed, "store is closed")))
        }
    }

    /// Queues `op`; false once the queue is closed.
    func push(_ op: WriteOp) -> Bool {
        monitor.lock()
        defer { monitor.unlock() }
        if closed { return false }
        ops.append(op)
        var wakes = ops.count == 1
        if case .changes(let changes) = op {
            urgent = urgent || changes.urgent
            let before = queuedRecords
            queuedRecords += changes.count
            // The writer merges them now (it waits for it while it gathers).
            if before < Self.absorbedRecords, queuedRecords >= Self.absorbedRecords { wakes = true }
        } else if !awaited {
            awaited = true
            wakes = true
        }
        if idleWriter != nil {
            if ops.count == 1, !holding { queuedSinceMs = Timestamp.monotonicMs() }
            if writerIsIdle, writerIsWanted {
                setWriterPriority(idle: false)
                // A writer holding state changes at idle priority writes them now.
                wakes = true
            }
        }
        if wakes { monitor.signal() }
        return true
    }

    /// Deletes settled jobs finished before `finishedBeforeMs` in chunks of `chunk`, each its own queued write, so
    /// that a large sweep never holds up submissions for long; waits for each. The count deleted.
    func sweep(finishedBeforeMs: Int64, chunk: Int = 500) throws -> Int {
        var total = 0
        while true {
            let ticket = WriteTicket<Int>()
            guard push(.sweep(before: finishedBeforeMs, limit: chunk, ticket)) else {
                throw StoreError(.closed, "store is closed")
            }
            let deleted = try ticket.wait()
            total += deleted
            if deleted < chunk { return total }
        }
    }

    /// Called on the writer's thread before its first `take`: if the thread may go to idle priority and back
    /// (`IdlePriority.isReversible`: privileges or `RLIMIT_NICE` allow it), state changes alone are written there
    /// from now on, and it is logged; otherwise the writer keeps its priority, and the log says what would allow it.
    func writerStarted(logger: Logger) {
        let tid = currentThreadID()
        let nice = currentThreadNice()
        guard IdlePriority.isReversible(atNice: nice) else {
            logger.info("store writer stays at its priority: idle priority needs CAP_SYS_NICE or ulimit -e \(20 - nice)")
            return
        }
        monitor.withLock { idleWriter = tid }
        logger.info("store writer writes state changes alone at idle priority")
    }

    /// Whether the writer is at idle priority now (tests).
    var writerAtIdlePriority: Bool { monitor.withLock { writerIsIdle } }

    /// Whether what is queued wants the writer at its own priority: an op somebody waits on, urgent changes, or a
    /// first op that has waited `maxIdleLagMs`. With `monitor` held.
    private var writerIsWanted: Bool {
        awaited || urgent || ((!ops.isEmpty || holding) && Timestamp.monotonicMs() - queuedSinceMs >= lagMs)
    }

    /// Moves the writer to idle priority or back; with `monitor` held. A refusal leaves it where it was.
    private func setWriterPriority(idle: Bool) {
        guard let tid = idleWriter, idle != writerIsIdle, IdlePriority.set(idle, thread: tid) else { return }
        writerIsIdle = idle
    }

    /// Everything queued, waiting for at least one op; a batch of state changes alone is then held until
    /// `untilMs` (monotonic) for more to join it. An op somebody waits on, or closing, hands it over at once.
    /// With `idleMs`, the wait for the first op lasts at most that long, and an empty batch says none came.
    /// With `absorbing`, state changes that gather past `absorbedRecords` records are handed to it meanwhile (on the
    /// calling thread, the queue unlocked), to be merged into what the caller will write with the batch; a batch
    /// then comes even if all its changes went that way (an empty `Changes`), so that they are written.
    func take(
        gatheringChangesUntilMs untilMs: Int64, idleMs: Int64? = nil, absorbing absorb: (([Changes]) -> Void)? = nil
    ) -> [WriteOp]? {
        monitor.lock()
        defer { monitor.unlock() }
        if let idleMs {
            let idleUntil = Timestamp.monotonicMs() + idleMs
            while ops.isEmpty && !closed {
                let left = idleUntil - Timestamp.monotonicMs()
                if left <= 0 {
                    // What an idle writer does (a checkpoint) nobody waits for either.
                    setWriterPriority(idle: true)
                    return []
                }
                monitor.wait(milliseconds: left)
            }
        } else {
            while ops.isEmpty && !closed { monitor.wait() }
        }
        while !closed && !awaited {
            let deadline = Self.gatherUntil(untilMs, writerIsIdle: writerIsIdle, queuedSinceMs: queuedSinceMs, lagMs: lagMs)
            let left = deadline - Timestamp.monotonicMs()
            if left <= 0 { break }
            if let absorb, queuedRecords >= Self.absorbedRecords {
                // Nothing but state changes is queued while nobody waits (`awaited`).
                let changes = ops.compactMap { op -> Changes? in if case .changes(let c) = op { c } else { nil } }
                if changes.count == ops.count {
                    ops.removeAll(keepingCapacity: true)
                    queuedRecords = 0
                    holding = true
                    monitor.unlock()
                    absorb(changes)
                    monitor.lock()
                    continue
                }
            }
            monitor.wait(milliseconds: left)
        }
        return handOver()
    }

    /// Until when (monotonic ms) a batch of state changes alone is gathered before it is written: `untilMs`, or, while
    /// the writer is at idle priority, until the first of them has waited `lagMs`. An op somebody waits on, urgent
    /// changes, or the lag raise the writer (`push`), which ends the wait.
    ///
    /// Written as they come, even at idle priority, the state changes of a job of 100,000 fetches took the writer
    /// 2.3 s of CPU while the fetches ran (`perf`). Bench 25 with one build, a switch (not kept) on and off: jobs of
    /// 10,000 and 100,000 fetches took 1.15 and 1.34× curl's time with their changes written as they came, 0.93 and
    /// 1.02× with them held until the job settled (an urgent change).
    static func gatherUntil(_ untilMs: Int64, writerIsIdle: Bool, queuedSinceMs: Int64, lagMs: Int64) -> Int64 {
        writerIsIdle ? max(untilMs, queuedSinceMs &+ lagMs) : untilMs
    }

    /// Everything queued, waiting for at least one op (without a limit) or at most `limit` ms
    /// (then possibly none); `nil` once closed and drained.
    func take(waitingAtMostMs limit: Int64? = nil) -> [WriteOp]? {
        monitor.lock()
        defer { monitor.unlock() }
        if let limit {
            if ops.isEmpty && !closed && limit > 0 { monitor.wait(milliseconds: limit) }
        } else {
            while ops.isEmpty && !closed { monitor.wait() }
        }
        return handOver()
    }

    /// The queued ops, taken; `nil` once closed and drained. With `monitor` held.
    private func handOver() -> [WriteOp]? {
        // Closing is waited on too: the store's owner joins the writer.
        if idleWriter != nil { setWriterPriority(idle: !closed && !writerIsWanted) }
        urgent = false
        queuedRecords = 0
        let held = holding
        holding = false
        // Changes the writer merged while it gathered are written with this batch, even an empty one.
        if ops.isEmpty { return held ? [.changes(Changes(jobs: [], nodes: [], bodies: []))] : closed ? nil : [] }
        let batch = ops
        ops = []
        ops.reserveCapacity(batch.count)
        awaited = false
        return batch
    }

    /// Refuses further ops; those already queued are still written.
    func close() {
        monitor.lock()
        closed = true
        setWriterPriority(idle: false)
        monitor.signal()
        monitor.unlock()
    }
}

/// State changes not committed yet. Records are whole, so only the latest of each job, node and
/// body is kept: however long the disk stays full, this holds at most one record per live job and node.
struct PendingChanges {
    private(set) var jobs: [String: JobRecord] = [:]
    private(set) var nodes: [NodeKey: NodeRecord] = [:]
    private(set) var bodies: [BodyKey: BodyChange] = [:]
    /// The nodes of `nodes` whose rows are not stored yet: inserted, not updated.
    private(set) var unstored: Set<NodeKey> = []
    /// With `defersUnchangedRows`: node rows not stored yet and still as they were queued (pending), by job and
    /// position. Each is inserted with its first change, or with its job's row once the job settles, so a fetch
    /// that runs is one row write, not a pending row and then its update. They are not changes anybody waits for:
    /// they say nothing the job's stored request does not, and `Engine.rebuild` makes missing rows again, pending.
    /// Neither `isEmpty` nor `count` counts them; `removeAll` keeps them.
    private(set) var unchanged: [String: UnchangedRows] = [:]
    /// Whether unstored node rows wait in `unchanged` for their first change. Only where nothing else reads the
    /// rows of a job that is running (one SQLite server); servers sharing PostgreSQL read each other's.
    let defersUnchangedRows: Bool

    init(defersUnchangedRows: Bool = false) {
        self.defersUnchangedRows = defersUnchangedRows
    }

    var isEmpty: Bool { jobs.isEmpty && nodes.isEmpty && bodies.isEmpty }
    /// Records kept (jobs, nodes and bodies).
    var count: Int { jobs.count + nodes.count + bodies.count }

    mutating func merge(_ changes: Changes) {
        for node in changes.unstoredNodes {
            if defersUnchangedRows, let row = UnchangedRow(node) {
                unchanged[node.jobID, default: UnchangedRows()].add(row, at: node.position)
            } else {
                let key = NodeKey(jobID: node.jobID, position: node.position)
                nodes[key] = node
                unstored.insert(key)
            }
        }
        for node in changes.nodes {
            let key = NodeKey(jobID: node.jobID, position: node.position)
            if !unchanged.isEmpty, takeUnchanged(jobID: node.jobID, position: node.position) { unstored.insert(key) }
            nodes[key] = node
        }
        for job in changes.jobs {
            jobs[job.id] = job
            // A settled job's rows are all stored with it: reads of a job that is not running find every node.
            if job.state.isSettled, let rest = unchanged.removeValue(forKey: job.id) {
                rest.forEach { position, row in
                    let key = NodeKey(jobID: job.id, position: position)
                    nodes[key] = row.record(jobID: job.id, position: position)
                    unstored.insert(key)
                }
            }
        }
        for body in changes.bodies { bodies[BodyKey(jobID: body.jobID, nodeID: body.nodeID)] = body }
    }

    /// Takes the row of node `position` of job `jobID` out of `unchanged`, and the job with it once it has none
    /// left; false if the row was not there. One lookup of the job: this runs for every node change the writer takes.
    /// The writer also calls it to drop the rows of a map expansion it could not commit.
    @discardableResult
    mutating func takeUnchanged(jobID: String, position: Int) -> Bool {
        guard let k = unchanged.index(forKey: jobID), unchanged.values[k].take(position) else { return false }
        if unchanged.values[k].isEmpty { unchanged.remove(at: k) }
        return true
    }

    /// `nodes`' positions in the order of their rows' primary key, `(job_id, position)`, for the writers to write them
    /// in: a B-tree filled in its own order writes each page once. Written in the dictionary's order, which is
    /// random, the 100,000 node rows and bodies of a job that settles went to random pages of tables several times
    /// the writer's page cache: 959 and 986 MiB written and 974 and 1,011 MiB read for that job, against 407–408 MiB
    /// and 390–398 MiB in key order (docs/store.md, *Threads*).
    var nodesInRowOrder: [Dictionary<NodeKey, NodeRecord>.Index] {
        nodes.indices.sorted { nodes[$0].key.precedes(nodes[$1].key) }
    }

    /// `bodies`' positions in the order of their rows' primary key, `(job_id, node_id)`: as `nodesInRowOrder`.
    var bodiesInRowOrder: [Dictionary<BodyKey, BodyChange>.Index] {
        bodies.indices.sorted { bodies[$0].key.precedes(bodies[$1].key) }
    }

    /// Forgets the unchanged rows of a deleted job.
    mutating func forgetUnchanged(jobID: String) {
        unchanged[jobID] = nil
    }

    /// Empties the changes, keeping their tables' room for the next batch, unless a batch larger than
    /// `keptCapacity` made it: an idle writer holds a running job's changes until it settles, and the room the
    /// tables made for the 100,000 nodes of one job stayed: the server was at 174 MiB 12 s after that job (bench 88),
    /// and is at 68 MiB with the room let go (the same job, two runs).
    mutating func removeAll() {
        jobs.removeAll(keepingCapacity: jobs.capacity <= Self.keptCapacity)
        nodes.removeAll(keepingCapacity: nodes.capacity <= Self.keptCapacity)
        bodies.removeAll(keepingCapacity: bodies.capacity <= Self.keptCapacity)
        unstored.removeAll(keepingCapacity: unstored.capacity <= Self.keptCapacity)
    }

    /// The most entries a table keeps room for once emptied.
    static let keptCapacity = 4_096

    /// The changes in parts of about `maxRecords` records, each job's records (job, nodes, bodies)
    /// in the same part, so that no committed part shows a job half updated.
    func split(maxRecords: Int) -> [PendingChanges] {
        var byJob: [String: PendingChanges] = [:]
        for (id, job) in jobs { byJob[id, default: PendingChanges()].jobs[id] = job }
        for (key, node) in nodes { byJob[key.jobID, default: PendingChanges()].nodes[key] = node }
        for key in unstored { byJob[key.jobID, default: PendingChanges()].unstored.insert(key) }
        for (key, body) in bodies { byJob[key.jobID, default: PendingChanges()].bodies[key] = body }
        var parts: [PendingChanges] = []
        var part = PendingChanges()
        for group in byJob.values {
            if !part.isEmpty && part.count + group.count > maxRecords {
                parts.append(part)
                part = PendingChanges()
            }
            part.jobs.merge(group.jobs) { $1 }
            part.nodes.merge(group.nodes) { $1 }
            part.bodies.merge(group.bodies) { $1 }
            part.unstored.formUnion(group.unstored)
        }
        if !part.isEmpty { parts.append(part) }
        return parts
    }

    /// Forgets the records of `part` (written on their own).
    mutating func remove(_ part: PendingChanges) {
        for id in part.jobs.keys { jobs[id] = nil }
        for key in part.nodes.keys { nodes[key] = nil }
        unstored.subtract(part.unstored)
        for key in part.bodies.keys { bodies[key] = nil }
    }
}

/// A node row as the job was created with it (pending, nothing run), without what its job and place say: what
/// `PendingChanges.unchanged` keeps for each node until its first change. Whole `NodeRecord`s there, 304 bytes each in a
/// dictionary by position, held 818 bytes a node: a job of 50,000 fetches waiting for their turn took 2,530 bytes
/// of memory a node where the target is 2 KiB.
struct UnchangedRow {
    let id: String
    let parent: String?
    let type: String

    /// The row of `node`, if `node` is such a row (else `nil`: it is written as it is).
    init?(_ node: NodeRecord) {
        id = node.id
        parent = node.parent
        type = node.type
        guard node == record(jobID: node.jobID, position: node.position) else { return nil }
    }

    func record(jobID: String, position: Int) -> NodeRecord {
        NodeRecord(jobID: jobID, id: id, parent: parent, position: position, type: type)
    }
}

/// One job's unchanged rows by position: an array for the positions that follow each other from the first one added
/// (a job's rows come in tree order, 0 to n - 1), a dictionary for any other.
struct UnchangedRows {
    private var first = 0
    private var run: [UnchangedRow?] = []
    private var others: [Int: UnchangedRow] = [:]
    /// Rows not taken.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    mutating func add(_ row: UnchangedRow, at position: Int) {
        if run.isEmpty && others.isEmpty { first = position }
        let k = position - first
        if k == run.count {
            // A position kept apart until the run reached it moves into the run.
            if others.removeValue(forKey: position) != nil { count -= 1 }
            run.append(row)
            count += 1
        } else if k >= 0 && k < run.count {
            if run[k] == nil { count += 1 }
            run[k] = row
        } else if others.updateValue(row, forKey: position) == nil {
            count += 1
        }
    }

    /// Takes the row at `position` out; false if it was not there.
    mutating func take(_ position: Int) -> Bool {
        let k = position - first
        if k >= 0 && k < run.count {
            guard run[k] != nil else { return false }
            run[k] = nil
        } else if others.removeValue(forKey: position) == nil {
            return false
        }
        count -= 1
        return true
    }

    func forEach(_ body: (Int, UnchangedRow) -> Void) {
        for (k, row) in run.enumerated() { if let row { body(first + k, row) } }
        for (position, row) in others { body(position, row) }
    }
}

struct NodeKey: Hashable {
    var jobID: String
    var position: Int

    /// Whether this row's key sorts before `other`'s in the `nodes` table (by job, then position).
    func precedes(_ other: NodeKey) -> Bool {
        jobID == other.jobID ? position < other.position : jobID < other.jobID
    }
}

struct BodyKey: Hashable {
    var jobID: String
    var nodeID: String

    /// Whether this row's key sorts before `other`'s in the `bodies` table (by job, then node; the same as the
    /// tables' byte order for the ASCII of generated ids, close to it for others: the order only saves work).
    func precedes(_ other: BodyKey) -> Bool {
        jobID == other.jobID ? nodeID < other.nodeID : jobID < other.jobID
    }
}

/// `StoreHealth` as the writer last left it; read, and waited for, from any thread.
final class WriterStatus: Sendable {
    private let value = Watched(StoreHealth())

    var health: StoreHealth { value.withLock { $0 } }

    func update(_ change: (inout StoreHealth) -> Void) { value.withLock { change(&$0) } }

    func wait(milliseconds: Int64, until accept: (StoreHealth) -> Bool) -> Bool {
        value.wait(milliseconds: milliseconds, until: accept)
    }

    /// Whether everything committed has been copied from the WAL into the database file (`checkpointWhileIdle`).
    private let walCopied = Watched(true)

    func setWALCopied(_ copied: Bool) { walCopied.withLock { $0 = copied } }

    func waitUntilWALCopied(milliseconds: Int64) -> Bool { walCopied.wait(milliseconds: milliseconds) { $0 } }
}

/// Runs on the writer thread and owns the writing connection.
///
/// A write that fails for lack of a resource (disk full, I/O error, lock, descriptors) makes the
/// writer *degraded*: the state changes stay in `pending` and are retried with a doubling delay
/// (50 ms up to 5 s) until they commit, while new submissions, deletes and flushes are refused at
/// once rather than each one waiting on a failing disk. The first commit ends it. That policy is `StoreWriting`'s,
/// shared with the PostgreSQL writer; this class gives it SQLite's statements.
final class StoreWriter: StoreWriting, @unchecked Sendable {
    // @unchecked: the `var`s and `db` belong to the writer thread (`run` and what it calls), which is the only one
    // that touches them after `init`; `status` is shared and guards itself.
    private let db: SQLiteConnection
    let logger: Logger
    let status = WriterStatus()
    private var fullSync = false
    var pending = PendingChanges(defersUnchangedRows: true)
    var recovery = WriteRecovery()
    /// When the last transaction committed (monotonic ms).
    private var lastCommitMs: Int64 = 0
    /// Whether a commit may have left pages in the WAL that no checkpoint has copied since.
    private var walMayHoldCommits = false

    init(connection: SQLiteConnection, logger: Logger) {
        self.db = connection
        self.logger = logger
    }

    /// Writes batches until the queue is closed and drained, then closes the connection.
    func run(_ queue: WriteQueue) {
        queue.writerStarted(logger: logger)
        while true {
            let next: [WriteOp]?
            if let wait = recovery.retryWaitMs {
                next = queue.take(waitingAtMostMs: wait)
            } else {
                next = queue.take(
                    gatheringChangesUntilMs: lastCommitMs + StoreWriter.gatherMs,
                    idleMs: walMayHoldCommits ? StoreWriter.idleCheckpointMs : nil
                ) { [self] changes in
                    for change in changes { pending.merge(change) }
                }
                if next?.isEmpty == true {
                    checkpointWhileIdle()
                    continue
                }
            }
            guard let batch = next else { break }
            writeBatch(batch)
        }
        closing()
        db.close()
    }

    /// Records kept through a long failure can need more room in the WAL as one transaction than a disk
    /// that just got some space back has: on recovery they are written in parts of about this many
    /// records, the WAL emptied into the database after each.
    static let recoveryPartRecords = 256

    /// State changes that nobody waits on are committed at most this often (ms): a node that starts and ends
    /// within it is one row write, not two, and many turns of the engine share one commit. Creations, flushes
    /// and everything else somebody waits on are written at once, with whatever changes are queued.
    static let gatherMs: Int64 = 10

    /// How long the writer waits with nothing to write before it empties the WAL into the database (ms).
    static let idleCheckpointMs: Int64 = 100

    /// The WAL file is cut back to this size (`journal_size_limit`) when SQLite starts it over.
    static let walLimitBytes = 64 << 20

    /// Copies the WAL into the database file while nothing is queued. State changes are committed without an fsync
    /// (`synchronous=NORMAL`), so their pages wait in the OS's cache until a checkpoint, or until the next
    /// submission's fsynced commit flushes them along with its own: after a burst of state changes, the `201` of the
    /// next job waited for megabytes (up to 19 ms, against 2 for its own rows, after a 1,000-fetch job). SQLite's own
    /// checkpoint, inside the commit that takes the WAL past 1,000 pages, still runs as before. `PASSIVE`: no reader
    /// is waited for; what one still uses is left to the next checkpoint.
    ///
    /// A WAL copied whole and grown past `walLimitBytes` is also emptied here. SQLite would otherwise cut it back
    /// inside the next commit, which is a submission's: after a job of 100,000 fetches that `ftruncate` took
    /// 97–118 ms of the next job's `201`. No reader is waited for here either: one still reading leaves it to
    /// that commit, as before.
    private func checkpointWhileIdle() {
        walMayHoldCommits = false
        do {
            // One row: busy, frames in the WAL, frames copied.
            let checkpoint = try db.prepare("PRAGMA wal_checkpoint(PASSIVE)")
            defer { checkpoint.reset() }
            guard try checkpoint.step() else { return }
            guard checkpoint.int(0) == 0, checkpoint.int(1) == checkpoint.int(2) else { return }
            checkpoint.reset()
            if db.walFileBytes > StoreWriter.walLimitBytes {
                try? db.withoutBusyWait { try db.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
            }
            status.setWALCopied(true)
        } catch {
            // The next commit's fsync flushes the WAL as it did before; the writer reports the disk's state.
        }
    }

    /// While degraded with more than `recoveryPartRecords` records kept, writes them part by part; false (and
    /// degraded again) if a part fails for lack of a resource.
    func writeKeptChangesInParts() -> Bool {
        guard recovery.failure != nil, pending.count > StoreWriter.recoveryPartRecords else { return true }
        for part in pending.split(maxRecords: StoreWriter.recoveryPartRecords) {
            do {
                try transaction(fullSync: false, includesPending: false) { try write(part) }
            } catch let error as StoreError where error.isResourceFailure {
                degrade(error)
                return false
            } catch {
                // A real bug in some record: the whole-batch path isolates and reports it.
                return true
            }
            pending.remove(part)
            // Frees the WAL's room for the next part; a checkpoint that cannot finish is no error here.
            try? execute("PRAGMA wal_checkpoint(TRUNCATE)")
        }
        return true
    }

    /// BEGIN IMMEDIATE, `body`, COMMIT, then `committed(includesPending:)`; rolled back if any of it throws.
    func transaction(fullSync: Bool, includesPending: Bool, _ body: () throws -> Void) throws {
        do {
            try setFullSync(fullSync)
            try execute("BEGIN IMMEDIATE")
            try body()
            try execute("COMMIT")
        } catch {
            rollback()
            throw error
        }
        lastCommitMs = Timestamp.monotonicMs()
        if !walMayHoldCommits {
            walMayHoldCommits = true
            status.setWALCopied(false)
        }
        committed(includesPending: includesPending)
    }

    func create(_ request: CreateRequest) throws -> CreateOutcome {
        let job = request.job
        let insert = try db.prepare(SQL.insertJob)
        Rows.bind(job, to: insert)
        insert.bind(27, request.idempotencyKey)
        insert.bind(28, request.requestHash)
        try insert.run()
        if db.changes == 0 {
            // ON CONFLICT (idempotency_key) DO NOTHING: the key is taken.
            guard let key = request.idempotencyKey else {
                throw StoreError(.io, "job \(job.id) was not inserted")
            }
            let lookup = try db.prepare("SELECT \(Columns.job), request_hash FROM jobs WHERE idempotency_key = ?1")
            defer { lookup.reset() }
            lookup.bind(1, key)
            guard try lookup.step() else { throw StoreError(.io, "idempotency key \(key) is taken by no job") }
            var existing = try Rows.job(lookup)
            let hash = lookup.string(Columns.jobCount)
            lookup.reset()
            try Rows.assembleResult(of: &existing, db: db)
            return hash == request.requestHash ? .existing(existing) : .conflict(existing)
        }
        let insertRequest = try db.prepare(SQL.insertRequest)
        insertRequest.bind(1, job.id)
        insertRequest.bind(2, json: job.request)
        try insertRequest.run()
        let insertNode = try db.prepare(SQL.insertNode)
        for node in request.nodes {
            insertNode.reset()
            Rows.bind(node, jobID: job.id, to: insertNode)
            try insertNode.run()
        }
        return .created(job)
    }

    /// The items' row only: the copies' rows wait for their first change (`expandMap`).
    func insert(_ expansion: MapExpansionRecord) throws {
        let items = try db.prepare(
            "INSERT INTO map_items (job_id, node_id, first_position, items) SELECT ?1, ?2, ?3, ?4 "
                + "WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?1)")
        items.bind(1, expansion.jobID)
        items.bind(2, expansion.nodeID)
        items.bind(3, expansion.firstPosition)
        items.bind(4, json: expansion.items)
        try items.run()
    }

    func write(_ pending: PendingChanges) throws {
        if !pending.jobs.isEmpty {
            let update = try db.prepare(SQL.updateJob)
            for job in pending.jobs.values {
                update.reset()
                Rows.bind(job, to: update)
                try update.run()
            }
        }
        if !pending.nodes.isEmpty {
            let update = try db.prepare(SQL.updateNode)
            let insert = pending.unstored.isEmpty ? nil : try db.prepare(SQL.insertNode)
            for k in pending.nodesInRowOrder {
                let (key, node) = pending.nodes[k]
                let statement = pending.unstored.contains(key) ? insert ?? update : update
                statement.reset()
                Rows.bind(node, jobID: node.jobID, to: statement)
                try statement.run()
            }
        }
        if !pending.bodies.isEmpty {
            let upsert = try db.prepare(SQL.upsertBody)
            for k in pending.bodiesInRowOrder {
                let change = pending.bodies[k].value
                upsert.reset()
                upsert.bind(1, change.jobID)
                upsert.bind(2, change.nodeID)
                upsert.bind(3, change.body.contentType)
                upsert.bind(4, blob: change.body.bytes)
                try upsert.run()
            }
        }
    }

    /// Rewrites the newest job row with its own values: a real page write (SQLite writes an updated
    /// row even when nothing in it changed) that changes nothing, to learn whether the disk takes
    /// writes again when there is nothing else to retry. An empty table writes nothing, and then
    /// there is nothing to lose either.
    func probe() throws {
        try execute("UPDATE jobs SET version = version WHERE id = (SELECT max(id) FROM jobs)")
    }

    /// Deletes the job's row and every row of it in the other tables, and forgets its rows not stored yet.
    func deleteJob(_ id: String) throws -> Bool {
        let job = try db.prepare("DELETE FROM jobs WHERE id = ?1")
        job.bind(1, id)
        try job.run()
        let deleted = db.changes > 0
        for table in ["job_requests", "nodes", "bodies", "map_items"] {
            let rows = try db.prepare("DELETE FROM \(table) WHERE job_id = ?1")
            rows.bind(1, id)
            try rows.run()
        }
        pending.forgetUnchanged(jobID: id)
        return deleted
    }

    func sweep(before: Int64, limit: Int) throws -> Int {
        let select = try db.prepare(
            "SELECT id FROM jobs WHERE finished_at < ?1 AND state NOT IN ('\(NodeState.pending.rawValue)', '\(NodeState.running.rawValue)') LIMIT ?2")
        select.bind(1, before)
        select.bind(2, Int64(limit))
        var ids: [String] = []
        do {
            defer { select.reset() }
            while try select.step() { if let id = select.string(0) { ids.append(id) } }
        }
        var count = 0
        for id in ids where try deleteJob(id) { count += 1 }
        return count
    }

    private func setFullSync(_ full: Bool) throws {
        if full == fullSync { return }
        try execute(full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL")
        fullSync = full
    }

    private func execute(_ sql: String) throws {
        try db.prepare(sql).run()
    }

    private func rollback() {
        if db.inTransaction { try? execute("ROLLBACK") }
    }
}

// MARK: - Reader connections

/// The reader connections, each read-only (`query_only`) and handed to one thread at a time.
final class ReaderPool: Sendable {
    private let connections: IdleConnections<SQLiteConnection>

    init(path: String) {
        connections = IdleConnections(
            open: {
                let connection = try SQLiteConnection(path: path, create: false)
                do {
                    try connection.execute("PRAGMA query_only = ON")
                } catch {
                    connection.close()
                    throw error
                }
                return connection
            },
            close: { $0.close() })
    }

    func with<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        let connection = try connections.borrow()
        defer {
            if connection.inTransaction { try? connection.execute("ROLLBACK") }
            connections.giveBack(connection)
        }
        return try body(connection)
    }

    func close() { connections.close() }
}

// MARK: - Rows

/// Column lists shared by the statements and `Rows`, which reads them by index.
enum Columns {
    /// The first 17 columns of every job read, through `metadata`; then `result`, `request`, the schedule's and
    /// `result_ref`.
    private static let jobHead = "id, name, state, created_at, started_at, finished_at, deadline_ms, version, "
        + "p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, "
    /// What `job` reads, in `jobs` (unaliased).
    static let job = jobHead + "result, " + request + ", " + Columns.schedule + ", result_ref"
    /// The columns of `jobs` that `job` reads, as an insert names them.
    static let jobRow = jobHead + "result, request, " + Columns.schedule + ", result_ref"
    /// A job's submitted request: in `job_requests` (schema version 9), or in the `jobs` row written before it.
    static let request = "COALESCE((SELECT request FROM job_requests WHERE job_id = jobs.id), jobs.request)"
    /// Listings leave out the two columns that may be large.
    static let listedJob = jobHead + "NULL, NULL, " + Columns.schedule + ", NULL"
    /// What reads show: `request`, which may be large and is only needed to rebuild a job, is left out but for
    /// its `input` (SQLite picks it out, so the request is never parsed in Swift): the `request` of a job read so
    /// is `{"input": …}` when it was given one, else `null`.
    static let shownJob = jobHead + "result, "
        + "COALESCE((SELECT \(input(of: "request")) FROM job_requests WHERE job_id = jobs.id), \(input(of: "jobs.request"))), "
        + Columns.schedule + ", result_ref"
    /// `{"input": …}` of the request in `column`, or `NULL` (a row written before version 9 has it in `jobs`, a row
    /// written since has it empty there).
    private static func input(of column: String) -> String {
        "CASE WHEN NOT json_valid(\(column)) THEN NULL WHEN json_type(\(column), '$.input') IS NULL THEN NULL "
            + "ELSE json_object('input', json(\(column) -> '$.input')) END"
    }
    /// How many columns `job` has.
    static let jobCount: Int32 = 26
    /// API.md §8, columns 19–24 of `job`.
    static let schedule = "not_before, due_at, concurrency_key, concurrency_limit, attempt, retried_at"

    static let node = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, elapsed_ms, "
        + "status, recovered, error, result, request, pages, result_ref"
    static let nodeWithoutResult = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, "
        + "elapsed_ms, status, recovered, error, NULL, request, pages, NULL"
    /// What putting a job's result together reads of its nodes: not the request each fetch sent, nor its pages.
    static let nodeForResults = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, "
        + "elapsed_ms, status, recovered, error, result, NULL, NULL, result_ref"

    /// `columns` with each name qualified by `table`.
    static func prefixed(_ table: String, _ columns: String) -> String {
        columns.split(separator: ",").map { "\(table).\($0.trimmingSpaces())" }.joined(separator: ", ")
    }
}

enum SQL {
    /// `request` (?19) is left empty: it goes in `job_requests` (`insertRequest`).
    static let insertJob = "INSERT INTO jobs (\(Columns.jobRow), idempotency_key, request_hash) VALUES ("
        + (1...28).map { $0 == 19 ? "''" : "?\($0)" }.joined(separator: ", ") + ") ON CONFLICT (idempotency_key) DO NOTHING"
    static let insertRequest = "INSERT INTO job_requests (job_id, request) VALUES (?1, ?2)"
    /// Everything but `request`, which never changes.
    static let updateJob = "UPDATE jobs SET name = ?2, state = ?3, created_at = ?4, started_at = ?5, finished_at = ?6, "
        + "deadline_ms = ?7, version = ?8, p_total = ?9, p_pending = ?10, p_running = ?11, p_succeeded = ?12, "
        + "p_failed = ?13, p_cancelled = ?14, p_skipped = ?15, error = ?16, metadata = ?17, result = ?18, "
        + "not_before = ?20, due_at = ?21, concurrency_key = ?22, concurrency_limit = ?23, attempt = ?24, "
        + "retried_at = ?25, result_ref = ?26 WHERE id = ?1"
    static let insertNode = "INSERT INTO nodes (\(Columns.node)) VALUES ("
        + (1...17).map { "?\($0)" }.joined(separator: ", ") + ")"
    /// What changes as a node runs; not `id`, `parent` or `type`, which never do: setting `id`, even to itself,
    /// would rewrite its `nodes_job_node` entry with every update. `Rows.bind` still binds them (?3–?5).
    static let updateNode = "UPDATE nodes SET state = ?6, attempts = ?7, "
        + "started_at = ?8, finished_at = ?9, elapsed_ms = ?10, status = ?11, recovered = ?12, error = ?13, "
        + "result = ?14, request = ?15, pages = ?16, result_ref = ?17 WHERE job_id = ?1 AND position = ?2"
    /// Bodies of deleted jobs are not kept.
    static let upsertBody = "INSERT OR REPLACE INTO bodies (job_id, node_id, content_type, bytes) "
        + "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?1)"
}

/// Records to and from statement parameters and columns.
enum Rows {
    /// Steps `statement` to its end and resets it, one job a row; a row that cannot be read goes to `skipped`, with
    /// its error, as far as it can be read.
    static func jobs(stepping statement: SQLiteStatement, skipped: inout [UnreadableJob]) throws -> [JobRecord] {
        defer { statement.reset() }
        var jobs: [JobRecord] = []
        while try statement.step() {
            do {
                jobs.append(try job(statement))
            } catch let error as StoreError {
                if let partial = partialJob(statement) { skipped.append(UnreadableJob(job: partial, error: error)) }
            }
        }
        return jobs
    }

    /// Stored JSON was parsed before it was written, under whatever `--max-depth` was in force then; this only
    /// bounds the work on a damaged file.
    static let maxJSONDepth = Limits.storedJSONDepth

    /// Binds parameters 1–18 and 20–26 (every column but `request`).
    static func bind(_ job: JobRecord, to statement: SQLiteStatement) {
        statement.bind(1, job.id)
        statement.bind(2, job.name)
        statement.bind(3, job.state.rawValue)
        statement.bind(4, job.createdAt)
        statement.bind(5, job.startedAt)
        statement.bind(6, job.finishedAt)
        statement.bind(7, job.deadlineMs)
        statement.bind(8, job.version)
        statement.bind(9, job.progress.total)
        // Parameters 10–15: the counts in `NodeState.allCases` order, as the columns are.
        for (k, state) in NodeState.allCases.enumerated() { statement.bind(Int32(10 + k), job.progress[state]) }
        statement.bind(16, json: job.error?.json)
        statement.bind(17, json: job.metadata)
        let result = ResultAssembly.stored(job.result, job.resultSource)
        statement.bind(18, json: result.result)
        statement.bind(26, result.ref)
        statement.bind(20, job.notBefore)
        statement.bind(21, job.dueAt)
        statement.bind(22, job.concurrencyKey)
        statement.bind(23, job.concurrencyLimit)
        statement.bind(24, job.attempt)
        statement.bind(25, job.retriedAt)
    }

    /// What can be read of a job row whose JSON columns cannot: the id, counters and times, without
    /// `request`, `metadata`, `result` or `error`; `nil` without an id or a known state.
    static func partialJob(_ s: SQLiteStatement) -> JobRecord? {
        guard let id = s.string(0), let state = try? self.state(s, 2) else { return nil }
        var progress = Progress()
        progress.total = s.int(8)
        for (k, state) in NodeState.allCases.enumerated() { progress[state] = s.int(Int32(9 + k)) }
        return JobRecord(
            id: id, name: s.string(1), state: state, createdAt: s.int64(3), startedAt: s.optionalInt64(4),
            finishedAt: s.optionalInt64(5), request: .null, deadlineMs: s.optionalInt(6), version: s.int64(7),
            progress: progress)
    }

    static func job(_ s: SQLiteStatement) throws -> JobRecord {
        guard let id = s.string(0) else { throw StoreError(.corrupt, "job without id") }
        let state = try self.state(s, 2)
        var progress = Progress()
        progress.total = s.int(8)
        for (k, state) in NodeState.allCases.enumerated() { progress[state] = s.int(Int32(9 + k)) }
        var job = JobRecord(
            id: id, name: s.string(1), state: state, createdAt: s.int64(3), startedAt: s.optionalInt64(4),
            // Reads never show the request; one that cannot be read fails only the rebuild of its job.
            finishedAt: s.optionalInt64(5), request: (try? s.json(18, maxDepth: maxJSONDepth)) ?? .null,
            metadata: try s.json(16, maxDepth: maxJSONDepth), deadlineMs: s.optionalInt(6),
            result: try s.json(17, maxDepth: maxJSONDepth), error: try error(s, 15), version: s.int64(7),
            progress: progress)
        // The input is part of the submitted body; listings, which leave the body out, have none.
        job.input = job.request["input"]
        job.notBefore = s.optionalInt64(19)
        job.dueAt = s.optionalInt64(20)
        job.concurrencyKey = s.string(21)
        job.concurrencyLimit = s.optionalInt(22)
        job.attempt = max(1, s.int(23))
        job.retriedAt = s.optionalInt64(24)
        job.resultSource = try ResultSource(code: s.optionalInt(25))
        return job
    }

    /// Binds parameters 1–17.
    static func bind(_ node: NodeRecord, jobID: String, to statement: SQLiteStatement) {
        statement.bind(1, jobID)
        statement.bind(2, node.position)
        statement.bind(3, node.id)
        statement.bind(4, node.parent)
        statement.bind(5, node.type)
        statement.bind(6, node.state.rawValue)
        statement.bind(7, node.attempts)
        statement.bind(8, node.startedAt)
        statement.bind(9, node.finishedAt)
        statement.bind(10, node.elapsedMs)
        statement.bind(11, node.status)
        statement.bind(12, node.recovered)
        statement.bind(13, json: node.error?.json)
        let result = ResultAssembly.stored(node.result, node.resultSource)
        statement.bind(14, json: result.result)
        statement.bind(17, result.ref)
        statement.bind(15, json: node.request)
        statement.bind(16, node.pages)
    }

    static func node(_ s: SQLiteStatement) throws -> NodeRecord {
        guard let jobID = s.string(0), let id = s.string(2), let type = s.string(4) else {
            throw StoreError(.corrupt, "node without job id, id or type")
        }
        var node = NodeRecord(
            jobID: jobID, id: id, parent: s.string(3), position: s.int(1), type: type, state: try state(s, 5),
            attempts: s.int(6), startedAt: s.optionalInt64(7), finishedAt: s.optionalInt64(8),
            elapsedMs: s.optionalInt(9), status: s.optionalInt(10), error: try error(s, 12),
            recovered: s.int64(11) != 0, result: try s.json(13, maxDepth: maxJSONDepth))
        node.request = try s.json(14, maxDepth: maxJSONDepth)
        node.pages = s.optionalInt(15)
        node.resultSource = try ResultSource(code: s.optionalInt(16))
        return node
    }

    static func state(_ s: SQLiteStatement, _ column: Int32) throws -> NodeState {
        guard let text = s.string(column), let state = NodeState(rawValue: text) else {
            throw StoreError(.corrupt, "unknown state \(s.string(column) ?? "NULL")")
        }
        return state
    }

    static func error(_ s: SQLiteStatement, _ column: Int32) throws -> NodeError? {
        guard let json = try s.json(column, maxDepth: maxJSONDepth) else { return nil }
        guard let error = NodeError(json: json) else { throw StoreError(.corrupt, "stored error is not an error object") }
        return error
    }
}

// MARK: - Cursors

/// The opaque list cursor: the id of the last job of a page, hex-encoded behind a version letter.
enum JobCursor {
    private static let digits = Array("0123456789abcdef".utf8)

    static func encode(_ id: String) -> String {
        var out: [UInt8] = [UInt8(ascii: "c")]
        for byte in id.utf8 {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// - Throws: `StoreError.badCursor` for anything `encode` did not produce.
    static func decode(_ cursor: String) throws -> String {
        let bad = StoreError(.badCursor, "invalid cursor")
        let bytes = Array(cursor.utf8)
        guard bytes.count >= 3, bytes.count % 2 == 1, bytes.count <= 1025, bytes[0] == UInt8(ascii: "c") else { throw bad }
        var id: [UInt8] = []
        id.reserveCapacity(bytes.count / 2)
        var index = 1
        while index < bytes.count {
            // Ids are printable ASCII, so only high digits 2–7 occur: openapi.yaml's cursor pattern says the same.
            guard let high = value(bytes[index]), (2...7).contains(high), let low = value(bytes[index + 1]) else {
                throw bad
            }
            id.append(high << 4 | low)
            index += 2
        }
        return String(decoding: id, as: UTF8.self)
    }

    private static func value(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
        default: return nil
        }
    }
}
