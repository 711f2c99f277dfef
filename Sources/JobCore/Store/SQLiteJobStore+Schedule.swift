// Reads for jobs that wait in the store for their `not_before` (API.md §8): they are not among
// `unfinishedJobs`, and the engine takes them in, a batch at a time, when they are due.

extension SQLiteJobStore {
    /// Jobs with `due_at` at or before `atOrBeforeMs` (and after `after`, in `(due_at, id)` order), earliest
    /// first, at most `limit`, with their nodes (results included), from one snapshot; a job that cannot be read
    /// whole is appended to `unreadable`.
    public func dueJobs(
        atOrBeforeMs: Int64, after: (dueAt: Int64, id: String)?, limit: Int, maxNodes: Int, skipping: (String) -> Bool,
        unreadable: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        var skipped: [UnreadableJob] = []
        defer { unreadable.append(contentsOf: skipped) }
        return try readers.with { db in
            try db.execute("BEGIN")
            defer { try? db.execute("COMMIT") }
            let jobStatement = try db.prepare(
                "SELECT \(Columns.job) FROM jobs WHERE due_at IS NOT NULL AND due_at <= ?1 "
                    + "AND (due_at > ?3 OR (due_at = ?3 AND id > ?4)) ORDER BY due_at, id LIMIT ?2")
            defer { jobStatement.reset() }
            jobStatement.bind(1, atOrBeforeMs)
            jobStatement.bind(2, Int64(max(1, limit)))
            jobStatement.bind(3, after?.dueAt ?? Int64.min)
            jobStatement.bind(4, after?.id ?? "")
            let jobs = try Rows.jobs(stepping: jobStatement, skipped: &skipped)
            let nodeStatement = try db.prepare(
                "SELECT \(Columns.node) FROM nodes WHERE job_id = ?1 ORDER BY position")
            defer { nodeStatement.reset() }
            var found: [(job: JobRecord, nodes: [NodeRecord])] = []
            var nodesRead = 0
            for job in jobs {
                if nodesRead > maxNodes { break }
                if skipping(job.id) {
                    found.append((job, []))
                    continue
                }
                nodeStatement.reset()
                nodeStatement.bind(1, job.id)
                var nodes: [NodeRecord] = []
                do {
                    while try nodeStatement.step() { nodes.append(try Rows.node(nodeStatement)) }
                    nodeStatement.reset()
                    // A retried job that waits for its time keeps its succeeded nodes, with their whole results.
                    var assembled = job
                    try Rows.assemble(&nodes, jobID: job.id, db: db)
                    try ResultAssembly.assemble(&assembled, nodes: nodes)
                    nodesRead += nodes.count
                    found.append((assembled, nodes))
                } catch let error as StoreError {
                    skipped.append(UnreadableJob(job: job, error: error))
                }
            }
            return found
        }
    }

    /// The earliest `due_at` later than `afterMs` of the jobs waiting in the store, or `nil`.
    public func nextDueAt(after afterMs: Int64) throws -> Int64? {
        try readers.with { db in
            let statement = try db.prepare("SELECT min(due_at) FROM jobs WHERE due_at > ?1")
            defer { statement.reset() }
            statement.bind(1, afterMs)
            guard try statement.step() else { return nil }
            return statement.optionalInt64(0)
        }
    }

    /// How many jobs wait in the store for their time.
    public func scheduledJobCount() throws -> Int {
        try readers.with { db in
            let statement = try db.prepare("SELECT count(*) FROM jobs WHERE due_at IS NOT NULL")
            defer { statement.reset() }
            guard try statement.step() else { return 0 }
            return statement.int(0)
        }
    }
}
