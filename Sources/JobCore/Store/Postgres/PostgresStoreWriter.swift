/// Runs on the PostgreSQL store's writer thread and owns the writing connection: the policy the SQLite `StoreWriter`
/// shares (`StoreWriting`: group commit, keep and retry on resource failures, each op alone after a failed batch), on
/// libpq.
final class PostgresStoreWriter: StoreWriting, @unchecked Sendable {
    // @unchecked: everything but `status` (which locks itself) is touched only on the writer thread.
    private let db: PostgresConnection
    let logger: Logger
    let status = WriterStatus()
    var pending = PendingChanges()
    var recovery = WriteRecovery()
    private let leases: PostgresLeases
    /// Of the transaction in progress, applied to `leases` once it commits: jobs whose lease it took (written
    /// while no live server held them) and jobs whose changes it left out (another server holds them now).
    private var txAdopted: [String: Int64] = [:]
    private var txLost: [String: Int64?] = [:]
    /// The concurrency keys of the keyed jobs the transaction in progress settled or made wait (a retry, a due
    /// job taken in): once it commits, their waiting jobs may be let in (`keysWritten`, set before the writer
    /// thread starts). A new job's key is admitted by its submission (`Engine.admitSubmitted`).
    private var txKeys: Set<String> = []
    var keysWritten: ((Set<String>) -> Void)?

    init(connection: PostgresConnection, logger: Logger, leases: PostgresLeases) {
        self.db = connection
        self.logger = logger
        self.leases = leases
    }

    func run(_ queue: WriteQueue) {
        queue.writerStarted(logger: logger)
        while true {
            guard let batch = queue.take(waitingAtMostMs: recovery.retryWaitMs) else { break }
            writeBatch(batch)
        }
        closing()
        db.close()
    }

    /// BEGIN, `body`, COMMIT, then `committed(includesPending:)`; rolled back if any of it throws.
    func transaction(fullSync: Bool, includesPending: Bool, _ body: () throws -> Void) throws {
        txAdopted.removeAll()
        txLost.removeAll()
        txKeys.removeAll()
        do {
            try db.execute(fullSync ? "BEGIN" : "BEGIN; SET LOCAL synchronous_commit = off")
            try body()
            // COMMIT of a transaction that failed answers ROLLBACK without an error: the body threw before that.
            try db.execute("COMMIT")
        } catch {
            _ = try? db.execute("ROLLBACK")
            txAdopted.removeAll()
            txLost.removeAll()
            throw error
        }
        leases.own(txAdopted)
        leases.lose(txLost)
        if !txKeys.isEmpty { keysWritten?(txKeys) }
        txKeys.removeAll()
        txAdopted.removeAll()
        txLost.removeAll()
        committed(includesPending: includesPending)
    }

    func probe() throws {
        try db.execute("UPDATE jobs SET version = version WHERE id = (SELECT max(id) FROM jobs)")
    }

    /// PostgreSQL takes the changes kept in one transaction, however many.
    func writeKeptChangesInParts() -> Bool { true }

    func create(_ request: CreateRequest) throws -> CreateOutcome {
        let job = request.job
        var parameters = PGRows.parameters(job)
        parameters.append(PGRows.text(request.idempotencyKey))
        parameters.append(PGRows.text(request.requestHash))
        let inserted = try db.run(prepared: "insert_job", PGRows.insertJob, parameters)
        if inserted.affected == 0 {
            // ON CONFLICT (idempotency_key) DO NOTHING: the key is taken.
            guard let key = request.idempotencyKey else { throw StoreError(.io, "job \(job.id) was not inserted") }
            let rows = try db.run(
                prepared: "job_by_key", "SELECT \(PGRows.job), request_hash FROM jobs WHERE idempotency_key = $1",
                [.text(key)])
            guard let row = PGRows.rows(rows).first else { throw StoreError(.io, "idempotency key \(key) is taken by no job") }
            var existing = try PGRows.job(row)
            try PGRows.assembleResult(of: &existing, db: db)
            return row.string(PGRows.jobCount) == request.requestHash ? .existing(existing) : .conflict(existing)
        }
        try insertNodes(request.nodes.map { (node: $0, jobID: job.id) })
        // A job that waits for its time is nobody's until it starts (its first write takes it).
        if job.dueAt == nil {
            try db.run(
                prepared: "lease_create",
                "UPDATE jobs SET lease_owner = $2, lease_generation = 1, lease_expires_at = \(PostgresLeases.nowMs) + $3 "
                    + "WHERE id = $1", [.text(job.id), .text(leases.owner), .int(leases.ttlMs)])
            txAdopted[job.id] = 1
        }
        return .created(job)
    }

    /// Rows per multi-row node insert: one round trip for a job of up to this many nodes (17 parameters a row,
    /// far below PostgreSQL's 65,535).
    static let nodesPerInsert = 64

    /// Inserts the nodes in statements of `nodesPerInsert` rows (prepared once per row count), rather than a round
    /// trip per node.
    private func insertNodes(_ rows: [(node: NodeRecord, jobID: String)]) throws {
        var start = 0
        while start < rows.count {
            let chunk = rows[start..<min(rows.count, start + Self.nodesPerInsert)]
            var parameters: [PostgresParameter] = []
            parameters.reserveCapacity(chunk.count * PGRows.nodeParameters)
            for row in chunk { parameters += PGRows.parameters(row.node, jobID: row.jobID) }
            try db.run(prepared: "insert_nodes_\(chunk.count)", PGRows.insertNodes(count: chunk.count), parameters)
            start += chunk.count
        }
    }

    func insert(_ expansion: MapExpansionRecord) throws {
        if try !fence([expansion.jobID]).isEmpty { return }
        let items = try db.run(
            prepared: "insert_map_items",
            "INSERT INTO map_items (job_id, node_id, first_position, items) "
                + "SELECT $1::text, $2::text, $3::bigint, $4::text WHERE EXISTS (SELECT 1 FROM jobs WHERE id = $1::text)",
            [.text(expansion.jobID), .text(expansion.nodeID), .int(expansion.firstPosition), PGRows.json(expansion.items)])
        guard items.affected > 0 else { return }
        // A copy changed before this commit: its change, written just before in this transaction, found no row to
        // update, so the row goes in as it now is.
        try insertNodes(expansion.nodes.map { node in
            (node: pending.nodes[NodeKey(jobID: expansion.jobID, position: node.position)] ?? node, jobID: expansion.jobID)
        })
    }

    func write(_ pending: PendingChanges) throws {
        var touched = Set(pending.jobs.keys)
        for key in pending.nodes.keys { touched.insert(key.jobID) }
        for key in pending.bodies.keys { touched.insert(key.jobID) }
        let fenced = try fence(touched)
        for job in pending.jobs.values where !fenced.contains(job.id) {
            try db.run(prepared: "update_job", PGRows.updateJob, PGRows.updateParameters(job))
            // A slot given back (settled) or a job that may wait for one (reset by a retry, or due).
            if let key = job.concurrencyKey, job.state != .running, job.dueAt == nil { txKeys.insert(key) }
        }
        var unstored: [(node: NodeRecord, jobID: String)] = []
        for k in pending.nodesInRowOrder where !fenced.contains(pending.nodes[k].key.jobID) {
            let (key, node) = pending.nodes[k]
            if pending.unstored.contains(key) {
                unstored.append((node: node, jobID: node.jobID))
            } else {
                try db.run(prepared: "update_node", PGRows.updateNode, PGRows.parameters(node, jobID: node.jobID))
            }
        }
        try insertNodes(unstored)
        try notifyChanged(touched.subtracting(fenced))
        for k in pending.bodiesInRowOrder where !fenced.contains(pending.bodies[k].key.jobID) {
            let change = pending.bodies[k].value
            try db.run(
                prepared: "upsert_body", PGRows.upsertBody,
                [.text(change.jobID), .text(change.nodeID), PGRows.text(change.body.contentType), .bytes(change.body.bytes)])
        }
    }

    func deleteJob(_ id: String) throws -> Bool {
        let deleted = try db.run(prepared: "delete_job", "DELETE FROM jobs WHERE id = $1", [.text(id)]).affected > 0
        try db.run(prepared: "delete_nodes", "DELETE FROM nodes WHERE job_id = $1", [.text(id)])
        try db.run(prepared: "delete_bodies", "DELETE FROM bodies WHERE job_id = $1", [.text(id)])
        try db.run(prepared: "delete_map_items", "DELETE FROM map_items WHERE job_id = $1", [.text(id)])
        // Other servers drop their cached answer of the job.
        if deleted { try notifyChanged([id]) }
        return deleted
    }

    func sweep(before: Int64, limit: Int) throws -> Int {
        let rows = try db.run(
            prepared: "sweep_select",
            "SELECT id FROM jobs WHERE finished_at < $1 AND state NOT IN ('\(NodeState.pending.rawValue)', "
                + "'\(NodeState.running.rawValue)') LIMIT $2",
            [.int(before), .int(limit)])
        var count = 0
        for row in rows.rows { if let id = row.first ?? nil, try deleteJob(id) { count += 1 } }
        return count
    }

    // MARK: Leases

    /// Locks the rows of `ids` for this transaction and returns those whose changes must not be written: jobs
    /// whose lease another server took (their generation moved on), and jobs this server does not own that a
    /// live server holds. A job owned by nobody, by this server, or whose lease expired, or that has settled, is
    /// taken (a new generation): a retried job, one that waited for its time, a settled job's left-over nodes.
    /// The row locks keep a claim (`FOR UPDATE SKIP LOCKED`) from taking the job before this commits.
    private func fence(_ ids: Set<String>) throws -> Set<String> {
        guard !ids.isEmpty else { return [] }
        let rows = try db.run(
            prepared: "lease_check",
            "SELECT id, lease_owner, lease_generation, "
                + "(lease_expires_at IS NULL OR lease_expires_at < \(PostgresLeases.nowMs)), state IN \(PostgresJobStore.unfinished) "
                + "FROM jobs WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE",
            [PostgresLeases.array(ids)])
        var blocked: Set<String> = []
        var adopt: [String] = []
        for row in PGRows.rows(rows) {
            guard let id = row.string(0) else { continue }
            let owner = row.string(1)
            let generation = row.int64(2)
            if let adopted = txAdopted[id] {
                if owner != leases.owner || generation != adopted { blocked.insert(id) }
                continue
            }
            switch leases.standing(of: id) {
            case .owned(let mine):
                if owner != leases.owner || generation != mine {
                    blocked.insert(id)
                    txLost[id] = mine
                }
            case .lost:
                blocked.insert(id)
            case .unknown:
                if owner == nil || owner == leases.owner || row.string(3) == "t" || row.string(4) != "t" {
                    adopt.append(id)
                } else {
                    blocked.insert(id)
                    txLost[id] = .some(nil)
                }
            }
        }
        if !adopt.isEmpty {
            let taken = try db.run(
                prepared: "lease_adopt",
                "UPDATE jobs SET lease_owner = $1, lease_generation = lease_generation + 1, "
                    + "lease_expires_at = \(PostgresLeases.nowMs) + $2 WHERE id = ANY($3::text[]) RETURNING id, lease_generation",
                [.text(leases.owner), .int(leases.ttlMs), PostgresLeases.array(adopt)])
            for row in PGRows.rows(taken) {
                if let id = row.string(0) { txAdopted[id] = row.int64(1) }
            }
        }
        return blocked
    }

    /// Wakes the other servers' waiters on these jobs once this transaction commits: ids, comma-separated, in
    /// notifications under PostgreSQL's 8,000-byte payload bound.
    private func notifyChanged(_ ids: Set<String>) throws {
        var payload = ""
        for id in ids {
            if payload.utf8.count + id.utf8.count + 1 > 7_000 {
                try db.run(prepared: "notify_changed", "SELECT pg_notify('\(PostgresLeases.changedChannel)', $1)", [.text(payload)])
                payload = ""
            }
            if !payload.isEmpty { payload += "," }
            payload += id
        }
        if !payload.isEmpty {
            try db.run(prepared: "notify_changed", "SELECT pg_notify('\(PostgresLeases.changedChannel)', $1)", [.text(payload)])
        }
    }
}
