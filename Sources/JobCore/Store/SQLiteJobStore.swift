#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

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
/// commit returns — because a `201` promises the job survives anything.
///
/// **Reads** use a small pool of their own connections; in WAL mode they read
/// the last committed snapshot and never wait for the writer.
public final class SQLiteJobStore: JobStore, @unchecked Sendable {
    /// The database file.
    public let path: String

    private let logger: Logger
    private let queue: WriteQueue
    private let readers: ReaderPool
    private let writerThread: StoreThread
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
        self.readers = ReaderPool(path: path)
        // The thread holds the writer and the queue, not the store, so that
        // dropping the last reference to the store still closes it.
        self.writerThread = try StoreThread { writer.run(queue) }
        logger.debug("store opened", ["path": .string(path)])
    }

    deinit { close() }

    // MARK: Writes

    /// Hands the rows to the writer and waits for the (fsynced) commit that includes them.
    public func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?
    ) throws -> CreateOutcome {
        let ticket = WriteTicket<CreateOutcome>()
        let request = CreateRequest(job: job, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash)
        guard queue.push(.create(request, ticket)) else { throw StoreError(.closed, "store is closed") }
        return try ticket.wait()
    }

    /// Queues the changes for the writer's next batch; only the last record of a job or node in a batch is written.
    public func enqueue(jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)]) {
        if jobs.isEmpty && nodes.isEmpty && bodies.isEmpty { return }
        let changes = Changes(jobs: jobs, nodes: nodes, bodies: bodies.map { BodyChange(jobID: $0.jobID, nodeID: $0.nodeID, body: $0.body) })
        if !queue.push(.changes(changes)) {
            logger.warning("store is closed; state changes dropped", ["jobs": .int(jobs.count), "nodes": .int(nodes.count)])
        }
    }

    /// Waits for the writer to commit everything queued before this call.
    public func flush() throws {
        let ticket = WriteTicket<Void>()
        guard queue.push(.barrier(ticket)) else { throw StoreError(.closed, "store is closed") }
        try ticket.wait()
    }

    /// Deletes the job, its nodes and its bodies in one transaction of the writer.
    public func deleteJob(id: String) throws -> Bool {
        let ticket = WriteTicket<Bool>()
        guard queue.push(.delete(id, ticket)) else { throw StoreError(.closed, "store is closed") }
        return try ticket.wait()
    }

    /// Deletes settled jobs finished before `finishedBeforeMs`, 500 per transaction.
    public func sweep(finishedBeforeMs: Int64) throws -> Int {
        // In chunks, each its own queued write, so a large sweep never holds up
        // submissions for long.
        let chunk = 500
        var total = 0
        while true {
            let ticket = WriteTicket<Int>()
            guard queue.push(.sweep(before: finishedBeforeMs, limit: chunk, ticket)) else {
                throw StoreError(.closed, "store is closed")
            }
            let deleted = try ticket.wait()
            total += deleted
            if deleted < chunk { return total }
        }
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

    /// Reads the job on a reader connection.
    public func job(id: String) throws -> JobRecord? {
        try readers.with { db in
            let statement = try db.prepare("SELECT \(Columns.job) FROM jobs WHERE id = ?1")
            defer { statement.reset() }
            statement.bind(1, id)
            return try statement.step() ? try Rows.job(statement) : nil
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

    /// Reads a job's nodes in position order.
    public func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord] {
        let columns = includeResults ? Columns.node : Columns.nodeWithoutResult
        return try readers.with { db in
            let statement = try db.prepare("SELECT \(columns) FROM nodes WHERE job_id = ?1 ORDER BY position")
            defer { statement.reset() }
            statement.bind(1, jobID)
            var nodes: [NodeRecord] = []
            while try statement.step() { nodes.append(try Rows.node(statement)) }
            return nodes
        }
    }

    /// Reads one node with its result.
    public func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        try readers.with { db in
            let statement = try db.prepare("SELECT \(Columns.node) FROM nodes WHERE job_id = ?1 AND id = ?2")
            defer { statement.reset() }
            statement.bind(1, jobID)
            statement.bind(2, nodeID)
            return try statement.step() ? try Rows.node(statement) : nil
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

    /// Reads pending and running jobs and all their nodes with two queries in one snapshot.
    public func unfinishedJobs() throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        try readers.with { db in
            // One read transaction: jobs and nodes from the same snapshot.
            try db.execute("BEGIN")
            defer { try? db.execute("COMMIT") }
            let unfinished = "('\(NodeState.pending.rawValue)', '\(NodeState.running.rawValue)')"
            let jobStatement = try db.prepare("SELECT \(Columns.job) FROM jobs WHERE state IN \(unfinished) ORDER BY id")
            defer { jobStatement.reset() }
            var jobs: [JobRecord] = []
            while try jobStatement.step() { jobs.append(try Rows.job(jobStatement)) }
            jobStatement.reset()
            if jobs.isEmpty { return [] }

            let nodeStatement = try db.prepare(
                "SELECT \(Columns.prefixed("n", Columns.node)) FROM jobs j JOIN nodes n ON n.job_id = j.id WHERE j.state IN \(unfinished)")
            defer { nodeStatement.reset() }
            var byJob: [String: [NodeRecord]] = [:]
            byJob.reserveCapacity(jobs.count)
            while try nodeStatement.step() {
                let node = try Rows.node(nodeStatement)
                byJob[node.jobID, default: []].append(node)
            }
            return jobs.map { job in
                var nodes = byJob[job.id] ?? []
                let inOrder = zip(nodes, nodes.dropFirst()).allSatisfy { $0.position < $1.position }
                if !inOrder { nodes.sort { $0.position < $1.position } }
                return (job: job, nodes: nodes)
            }
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

    // MARK: Opening

    private static func configureWriter(_ connection: SQLiteConnection) throws {
        let mode = try connection.prepare("PRAGMA journal_mode = WAL")
        defer { mode.reset() }
        guard try mode.step(), mode.string(0)?.lowercased() == "wal" else {
            throw StoreError(.open, "cannot switch the database to WAL mode")
        }
        mode.reset()
        try connection.execute("""
            PRAGMA synchronous = NORMAL;
            PRAGMA journal_size_limit = 67108864;
            PRAGMA temp_store = MEMORY;
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
}

enum WriteOp {
    case create(CreateRequest, WriteTicket<CreateOutcome>)
    case changes(Changes)
    case delete(String, WriteTicket<Bool>)
    case sweep(before: Int64, limit: Int, WriteTicket<Int>)
    /// Answered once everything queued before it is committed.
    case barrier(WriteTicket<Void>)

    var needsFullSync: Bool {
        if case .create = self { return true }
        return false
    }
}

/// The writer's inbox. Only the writer thread waits on it.
final class WriteQueue: @unchecked Sendable {
    private let monitor = StoreMonitor()
    private var ops: [WriteOp] = []
    private var closed = false

    /// Queues `op`; false once the queue is closed.
    func push(_ op: WriteOp) -> Bool {
        monitor.lock()
        defer { monitor.unlock() }
        if closed { return false }
        ops.append(op)
        if ops.count == 1 { monitor.signal() }
        return true
    }

    /// Everything queued, waiting for at least one op; `nil` once closed and drained.
    func take() -> [WriteOp]? {
        monitor.lock()
        defer { monitor.unlock() }
        while ops.isEmpty && !closed { monitor.wait() }
        if ops.isEmpty { return nil }
        let batch = ops
        ops = []
        ops.reserveCapacity(batch.count)
        return batch
    }

    /// Refuses further ops; those already queued are still written.
    func close() {
        monitor.lock()
        closed = true
        monitor.signal()
        monitor.unlock()
    }
}

/// Runs on the writer thread and owns the writing connection.
final class StoreWriter: @unchecked Sendable {
    private let db: SQLiteConnection
    private let logger: Logger
    private var fullSync = false
    /// A failure of queued changes, reported by the next `flush`.
    private var changesFailure: StoreError?

    init(connection: SQLiteConnection, logger: Logger) {
        self.db = connection
        self.logger = logger
    }

    /// Writes batches until the queue is closed and drained, then closes the connection.
    func run(_ queue: WriteQueue) {
        while let batch = queue.take() { write(batch) }
        db.close()
    }

    private func write(_ batch: [WriteOp]) {
        let plan = Coalescing(batch)
        var answers: [() -> Void] = []
        var opFailed = false
        do {
            try setFullSync(batch.contains { $0.needsFullSync })
            try execute("BEGIN IMMEDIATE")
            do {
                for (index, op) in batch.enumerated() { try apply(op, index: index, plan: plan, answers: &answers) }
            } catch {
                opFailed = true
                throw error
            }
            try execute("COMMIT")
            for answer in answers { answer() }
            return
        } catch {
            rollback()
            let storeError = error as? StoreError ?? StoreError(.io, "\(error)")
            // The database itself refused (busy, full, I/O): trying each op again would only fail slower.
            if !opFailed || batch.count == 1 {
                logger.error("store write failed", ["error": .string(storeError.description), "ops": .int(batch.count)])
                for op in batch { fail(op, storeError) }
                return
            }
            logger.warning("store batch failed; writing its parts one by one", ["error": .string(storeError.description)])
        }
        // One op failing must not fail the others: each in its own transaction.
        for (index, op) in batch.enumerated() {
            var single: [() -> Void] = []
            do {
                try setFullSync(op.needsFullSync)
                try execute("BEGIN IMMEDIATE")
                try apply(op, index: index, plan: plan, answers: &single)
                try execute("COMMIT")
                for answer in single { answer() }
            } catch {
                rollback()
                let storeError = error as? StoreError ?? StoreError(.io, "\(error)")
                fail(op, storeError)
            }
        }
    }

    private func fail(_ op: WriteOp, _ error: StoreError) {
        switch op {
        case .create(_, let ticket): ticket.complete(.failure(error))
        case .delete(_, let ticket): ticket.complete(.failure(error))
        case .sweep(_, _, let ticket): ticket.complete(.failure(error))
        case .barrier(let ticket):
            changesFailure = nil
            ticket.complete(.failure(error))
        case .changes(let changes):
            logger.error("store could not write state changes", [
                "error": .string(error.description), "jobs": .int(changes.jobs.count), "nodes": .int(changes.nodes.count),
            ])
            changesFailure = error
        }
    }

    private func apply(_ op: WriteOp, index: Int, plan: Coalescing, answers: inout [() -> Void]) throws {
        switch op {
        case .create(let request, let ticket):
            let outcome = try create(request)
            answers.append { ticket.complete(.success(outcome)) }
        case .changes(let changes):
            try write(changes, index: index, plan: plan)
        case .delete(let id, let ticket):
            let deleted = try deleteJob(id)
            answers.append { ticket.complete(.success(deleted)) }
        case .sweep(let before, let limit, let ticket):
            let count = try sweep(before: before, limit: limit)
            answers.append { ticket.complete(.success(count)) }
        case .barrier(let ticket):
            answers.append { [self] in
                let failure = changesFailure
                changesFailure = nil
                ticket.complete(failure.map { .failure($0) } ?? .success(()))
            }
        }
    }

    private func create(_ request: CreateRequest) throws -> CreateOutcome {
        let job = request.job
        let insert = try db.prepare(SQL.insertJob)
        Rows.bind(job, to: insert)
        insert.bind(19, json: job.request)
        insert.bind(20, request.idempotencyKey)
        insert.bind(21, request.requestHash)
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
            let existing = try Rows.job(lookup)
            let hash = lookup.string(Columns.jobCount)
            return hash == request.requestHash ? .existing(existing) : .conflict(existing)
        }
        let insertNode = try db.prepare(SQL.insertNode)
        for node in request.nodes {
            insertNode.reset()
            Rows.bind(node, jobID: job.id, to: insertNode)
            try insertNode.run()
        }
        return .created(job)
    }

    private func write(_ changes: Changes, index: Int, plan: Coalescing) throws {
        if !changes.jobs.isEmpty {
            let update = try db.prepare(SQL.updateJob)
            for (offset, job) in changes.jobs.enumerated() where plan.isLast(job: job.id, op: index, offset: offset) {
                update.reset()
                Rows.bind(job, to: update)
                try update.run()
            }
        }
        if !changes.nodes.isEmpty {
            let update = try db.prepare(SQL.updateNode)
            for (offset, node) in changes.nodes.enumerated()
            where plan.isLast(node: NodeKey(jobID: node.jobID, position: node.position), op: index, offset: offset) {
                update.reset()
                Rows.bind(node, jobID: node.jobID, to: update)
                try update.run()
            }
        }
        if !changes.bodies.isEmpty {
            let upsert = try db.prepare(SQL.upsertBody)
            for change in changes.bodies {
                upsert.reset()
                upsert.bind(1, change.jobID)
                upsert.bind(2, change.nodeID)
                upsert.bind(3, change.body.contentType)
                upsert.bind(4, blob: change.body.bytes)
                try upsert.run()
            }
        }
    }

    private func deleteJob(_ id: String) throws -> Bool {
        let job = try db.prepare("DELETE FROM jobs WHERE id = ?1")
        job.bind(1, id)
        try job.run()
        let deleted = db.changes > 0
        let nodes = try db.prepare("DELETE FROM nodes WHERE job_id = ?1")
        nodes.bind(1, id)
        try nodes.run()
        let bodies = try db.prepare("DELETE FROM bodies WHERE job_id = ?1")
        bodies.bind(1, id)
        try bodies.run()
        return deleted
    }

    private func sweep(before: Int64, limit: Int) throws -> Int {
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

struct NodeKey: Hashable {
    var jobID: String
    var position: Int
}

/// Within one batch only the last record queued for a job (or node) needs
/// writing: records are whole, so earlier ones would be overwritten in the
/// same transaction anyway.
struct Coalescing {
    private struct Slot: Equatable {
        var op: Int
        var offset: Int
    }

    private var lastJob: [String: Slot] = [:]
    private var lastNode: [NodeKey: Slot] = [:]

    init(_ batch: [WriteOp]) {
        for (op, item) in batch.enumerated() {
            guard case .changes(let changes) = item else { continue }
            for (offset, job) in changes.jobs.enumerated() { lastJob[job.id] = Slot(op: op, offset: offset) }
            for (offset, node) in changes.nodes.enumerated() {
                lastNode[NodeKey(jobID: node.jobID, position: node.position)] = Slot(op: op, offset: offset)
            }
        }
    }

    func isLast(job id: String, op: Int, offset: Int) -> Bool {
        lastJob[id] == Slot(op: op, offset: offset)
    }

    func isLast(node key: NodeKey, op: Int, offset: Int) -> Bool {
        lastNode[key] == Slot(op: op, offset: offset)
    }
}

// MARK: - Reader connections

/// Idle reader connections, handed to one thread at a time.
final class ReaderPool: @unchecked Sendable {
    private let path: String
    private let monitor = StoreMonitor()
    private var idle: [SQLiteConnection] = []
    private var closed = false
    /// Connections kept open when idle; more may exist while many threads read at once.
    private let keep = 8

    init(path: String) { self.path = path }

    func with<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        let connection = try borrow()
        defer { giveBack(connection) }
        return try body(connection)
    }

    func close() {
        monitor.lock()
        closed = true
        let connections = idle
        idle = []
        monitor.unlock()
        for connection in connections { connection.close() }
    }

    private func borrow() throws -> SQLiteConnection {
        monitor.lock()
        if closed {
            monitor.unlock()
            throw StoreError(.closed, "store is closed")
        }
        if let connection = idle.popLast() {
            monitor.unlock()
            return connection
        }
        monitor.unlock()
        let connection = try SQLiteConnection(path: path, create: false)
        try connection.execute("PRAGMA query_only = ON")
        return connection
    }

    private func giveBack(_ connection: SQLiteConnection) {
        if connection.inTransaction { try? connection.execute("ROLLBACK") }
        monitor.lock()
        if !closed && idle.count < keep {
            idle.append(connection)
            monitor.unlock()
            return
        }
        monitor.unlock()
        connection.close()
    }
}

// MARK: - Rows

/// Column lists shared by the statements and `Rows`, which reads them by index.
enum Columns {
    static let job = "id, name, state, created_at, started_at, finished_at, deadline_ms, version, "
        + "p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, result, request"
    /// Listings leave out the two columns that may be large.
    static let listedJob = "id, name, state, created_at, started_at, finished_at, deadline_ms, version, "
        + "p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, NULL, NULL"
    /// How many columns `job` has.
    static let jobCount: Int32 = 19

    static let node = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, elapsed_ms, "
        + "status, recovered, error, result, request"
    static let nodeWithoutResult = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, "
        + "elapsed_ms, status, recovered, error, NULL, request"

    /// `columns` with each name qualified by `table`.
    static func prefixed(_ table: String, _ columns: String) -> String {
        columns.split(separator: ",").map { "\(table).\($0.trimmingSpaces())" }.joined(separator: ", ")
    }
}

enum SQL {
    static let insertJob = "INSERT INTO jobs (\(Columns.job), idempotency_key, request_hash) VALUES ("
        + (1...21).map { "?\($0)" }.joined(separator: ", ") + ") ON CONFLICT (idempotency_key) DO NOTHING"
    /// Everything but `request`, which never changes.
    static let updateJob = "UPDATE jobs SET name = ?2, state = ?3, created_at = ?4, started_at = ?5, finished_at = ?6, "
        + "deadline_ms = ?7, version = ?8, p_total = ?9, p_pending = ?10, p_running = ?11, p_succeeded = ?12, "
        + "p_failed = ?13, p_cancelled = ?14, p_skipped = ?15, error = ?16, metadata = ?17, result = ?18 WHERE id = ?1"
    static let insertNode = "INSERT INTO nodes (\(Columns.node)) VALUES ("
        + (1...15).map { "?\($0)" }.joined(separator: ", ") + ")"
    static let updateNode = "UPDATE nodes SET id = ?3, parent = ?4, type = ?5, state = ?6, attempts = ?7, "
        + "started_at = ?8, finished_at = ?9, elapsed_ms = ?10, status = ?11, recovered = ?12, error = ?13, "
        + "result = ?14, request = ?15 WHERE job_id = ?1 AND position = ?2"
    /// Bodies of deleted jobs are not kept.
    static let upsertBody = "INSERT OR REPLACE INTO bodies (job_id, node_id, content_type, bytes) "
        + "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?1)"
}

/// Records to and from statement parameters and columns.
enum Rows {
    /// Stored JSON was parsed before it was written; this only bounds the work on a damaged file.
    static let maxJSONDepth = 4096

    /// Binds parameters 1–18 (every column but `request`).
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
        statement.bind(18, json: job.result)
    }

    static func job(_ s: SQLiteStatement) throws -> JobRecord {
        guard let id = s.string(0) else { throw StoreError(.corrupt, "job without id") }
        let state = try self.state(s, 2)
        var progress = Progress()
        progress.total = s.int(8)
        for (k, state) in NodeState.allCases.enumerated() { progress[state] = s.int(Int32(9 + k)) }
        var job = JobRecord(
            id: id, name: s.string(1), state: state, createdAt: s.int64(3), startedAt: s.optionalInt64(4),
            finishedAt: s.optionalInt64(5), request: try s.json(18, maxDepth: maxJSONDepth) ?? .null,
            metadata: try s.json(16, maxDepth: maxJSONDepth), deadlineMs: s.optionalInt(6),
            result: try s.json(17, maxDepth: maxJSONDepth), error: try error(s, 15), version: s.int64(7),
            progress: progress)
        // The input is part of the submitted body; listings, which leave the body out, have none.
        job.input = job.request["input"]
        return job
    }

    /// Binds parameters 1–15.
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
        statement.bind(14, json: node.result)
        statement.bind(15, json: node.request)
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
        return node
    }

    private static func state(_ s: SQLiteStatement, _ column: Int32) throws -> NodeState {
        guard let text = s.string(column), let state = NodeState(rawValue: text) else {
            throw StoreError(.corrupt, "unknown state \(s.string(column) ?? "NULL")")
        }
        return state
    }

    private static func error(_ s: SQLiteStatement, _ column: Int32) throws -> NodeError? {
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
