/// Records to and from PostgreSQL parameters and text-format rows, column for column as the SQLite store's
/// `Rows` (StoreSchema and PostgresSchema have the same columns).
enum PGRows {
    static let job = "id, name, state, created_at, started_at, finished_at, deadline_ms, version, "
        + "p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, result, request, "
        + "not_before, due_at, concurrency_key, concurrency_limit, attempt, retried_at, result_ref"
    /// Listings leave out the two columns that may be large.
    static let listedJob = "id, name, state, created_at, started_at, finished_at, deadline_ms, version, "
        + "p_total, p_pending, p_running, p_succeeded, p_failed, p_cancelled, p_skipped, error, metadata, NULL, NULL, "
        + "not_before, due_at, concurrency_key, concurrency_limit, attempt, retried_at, NULL"
    static let jobCount = 26

    static let node = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, elapsed_ms, "
        + "status, recovered, error, result, request, pages, result_ref"
    static let nodeWithoutResult = "job_id, position, id, parent, type, state, attempts, started_at, finished_at, "
        + "elapsed_ms, status, recovered, error, NULL, request, pages, NULL"
    /// As `Columns.nodeForResults`: what putting a job's result together reads of its nodes.
    static let nodeForResults = Columns.nodeForResults

    static func prefixed(_ table: String, _ columns: String) -> String {
        Columns.prefixed(table, columns)
    }

    static let insertJob = "INSERT INTO jobs (\(job), idempotency_key, request_hash) VALUES ("
        + (1...28).map { "$\($0)" }.joined(separator: ", ") + ") ON CONFLICT (idempotency_key) DO NOTHING"
    /// Everything but `request`, which never changes: the job's parameters without the 19th.
    static let updateJob = "UPDATE jobs SET name = $2, state = $3, created_at = $4, started_at = $5, finished_at = $6, "
        + "deadline_ms = $7, version = $8, p_total = $9, p_pending = $10, p_running = $11, p_succeeded = $12, "
        + "p_failed = $13, p_cancelled = $14, p_skipped = $15, error = $16, metadata = $17, result = $18, "
        + "not_before = $19, due_at = $20, concurrency_key = $21, concurrency_limit = $22, attempt = $23, "
        + "retried_at = $24, result_ref = $25 WHERE id = $1"
    /// `count` rows of `nodeParameters` parameters each.
    static func insertNodes(count: Int) -> String {
        let rows = (0..<max(1, count)).map { row in
            "(" + (1...nodeParameters).map { "$\(row * nodeParameters + $0)" }.joined(separator: ", ") + ")"
        }
        return "INSERT INTO nodes (\(node)) VALUES " + rows.joined(separator: ", ")
    }
    static let updateNode = "UPDATE nodes SET id = $3, parent = $4, type = $5, state = $6, attempts = $7, "
        + "started_at = $8, finished_at = $9, elapsed_ms = $10, status = $11, recovered = $12, error = $13, "
        + "result = $14, request = $15, pages = $16, result_ref = $17 WHERE job_id = $1 AND position = $2"
    /// Parameters of one node row.
    static let nodeParameters = 17
    /// Bodies of deleted jobs are not kept.
    static let upsertBody = "INSERT INTO bodies (job_id, node_id, content_type, bytes) "
        + "SELECT $1::text, $2::text, $3::text, $4::bytea WHERE EXISTS (SELECT 1 FROM jobs WHERE id = $1::text) "
        + "ON CONFLICT (job_id, node_id) DO UPDATE SET content_type = EXCLUDED.content_type, bytes = EXCLUDED.bytes"

    static let maxJSONDepth = Limits.storedJSONDepth

    // MARK: Parameters

    static func text(_ value: String?) -> PostgresParameter { value.map { .text($0) } ?? .null }
    static func int(_ value: Int?) -> PostgresParameter { value.map { .int($0) } ?? .null }
    static func int(_ value: Int64?) -> PostgresParameter { value.map { .int($0) } ?? .null }
    /// A string as its JSON text (`"…"`), for the columns of user text that may hold U+0000, which PostgreSQL's
    /// `text` cannot (and which libpq would cut the value at): `name` and `concurrency_key`.
    static func jsonString(_ value: String?) -> PostgresParameter { json(value.map { .string($0) }) }

    /// JSON as its compact text; `nil` as SQL NULL (so JSON `null` and absence stay distinct).
    static func json(_ value: JSONValue?) -> PostgresParameter {
        value.map { .text(String(decoding: $0.bytes, as: UTF8.self)) } ?? .null
    }

    /// Parameters 1–26 in `job` column order (the 19th is `request`).
    static func parameters(_ job: JobRecord) -> [PostgresParameter] {
        var out: [PostgresParameter] = [
            .text(job.id), jsonString(job.name), .text(job.state.rawValue), .int(job.createdAt), int(job.startedAt),
            int(job.finishedAt), int(job.deadlineMs), .int(job.version), .int(job.progress.total),
        ]
        for state in NodeState.allCases { out.append(.int(job.progress[state])) }
        out.append(json(job.error?.json))
        out.append(json(job.metadata))
        let result = ResultAssembly.stored(job.result, job.resultSource)
        out.append(json(result.result))
        out.append(json(job.request))
        out.append(int(job.notBefore))
        out.append(int(job.dueAt))
        out.append(jsonString(job.concurrencyKey))
        out.append(int(job.concurrencyLimit))
        out.append(.int(job.attempt))
        out.append(int(job.retriedAt))
        out.append(int(result.ref))
        return out
    }

    /// The parameters of `updateJob`.
    static func updateParameters(_ job: JobRecord) -> [PostgresParameter] {
        var out = parameters(job)
        out.remove(at: 18)
        return out
    }

    static func parameters(_ node: NodeRecord, jobID: String) -> [PostgresParameter] {
        let result = ResultAssembly.stored(node.result, node.resultSource)
        return [
            .text(jobID), .int(node.position), .text(node.id), text(node.parent), .text(node.type),
            .text(node.state.rawValue), .int(node.attempts), int(node.startedAt), int(node.finishedAt),
            int(node.elapsedMs), int(node.status), .int(node.recovered ? 1 : 0), json(node.error?.json),
            json(result.result), json(node.request), int(node.pages), int(result.ref),
        ]
    }

    // MARK: Rows

    struct Row {
        let values: [String?]
        func string(_ i: Int) -> String? { i < values.count ? values[i] : nil }
        func int64(_ i: Int) -> Int64 { string(i).flatMap { Int64($0) } ?? 0 }
        func optionalInt64(_ i: Int) -> Int64? { string(i).flatMap { Int64($0) } }
        func int(_ i: Int) -> Int { string(i).flatMap { Int($0) } ?? 0 }
        func optionalInt(_ i: Int) -> Int? { string(i).flatMap { Int($0) } }
        /// A column written by `jsonString`.
        func jsonString(_ i: Int) -> String? {
            guard let text = string(i) else { return nil }
            guard let value = try? JSONValue.parse(Array(text.utf8), maxDepth: 1), case .string(let decoded) = value else {
                return text
            }
            return decoded
        }
        func json(_ i: Int) throws -> JSONValue? {
            guard let text = string(i) else { return nil }
            do {
                return try JSONValue.parse(Array(text.utf8), maxDepth: PGRows.maxJSONDepth)
            } catch {
                throw StoreError(.corrupt, "stored column \(i) is not JSON: \(error)")
            }
        }
    }

    static func rows(_ result: PostgresRows) -> [Row] { result.rows.map(Row.init) }

    static func state(_ r: Row, _ column: Int) throws -> NodeState {
        guard let text = r.string(column), let state = NodeState(rawValue: text) else {
            throw StoreError(.corrupt, "unknown state \(r.string(column) ?? "NULL")")
        }
        return state
    }

    private static func error(_ r: Row, _ column: Int) throws -> NodeError? {
        guard let json = try r.json(column) else { return nil }
        guard let error = NodeError(json: json) else { throw StoreError(.corrupt, "stored error is not an error object") }
        return error
    }

    private static func progress(_ r: Row) -> Progress {
        var progress = Progress()
        progress.total = r.int(8)
        for (k, state) in NodeState.allCases.enumerated() { progress[state] = r.int(9 + k) }
        return progress
    }

    /// What can be read of a job row whose JSON columns cannot; `nil` without an id or a known state.
    static func partialJob(_ r: Row) -> JobRecord? {
        guard let id = r.string(0), let state = try? self.state(r, 2) else { return nil }
        return JobRecord(
            id: id, name: r.jsonString(1), state: state, createdAt: r.int64(3), startedAt: r.optionalInt64(4),
            finishedAt: r.optionalInt64(5), request: .null, deadlineMs: r.optionalInt(6), version: r.int64(7),
            progress: progress(r))
    }

    /// A job row; with `shown`, `request` becomes what reads show: `{"input": …}` when it has an input, else `null`.
    static func job(_ r: Row, shown: Bool = false) throws -> JobRecord {
        guard let id = r.string(0) else { throw StoreError(.corrupt, "job without id") }
        let state = try self.state(r, 2)
        // Reads never show the request; one that cannot be read fails only the rebuild of its job.
        var request = (try? r.json(18)) ?? .null
        if shown { request = request["input"].map { .object(["input": $0]) } ?? .null }
        var job = JobRecord(
            id: id, name: r.jsonString(1), state: state, createdAt: r.int64(3), startedAt: r.optionalInt64(4),
            finishedAt: r.optionalInt64(5), request: request,
            metadata: try r.json(16), deadlineMs: r.optionalInt(6),
            result: try r.json(17), error: try error(r, 15), version: r.int64(7),
            progress: progress(r))
        job.input = job.request["input"]
        job.notBefore = r.optionalInt64(19)
        job.dueAt = r.optionalInt64(20)
        job.concurrencyKey = r.jsonString(21)
        job.concurrencyLimit = r.optionalInt(22)
        job.attempt = max(1, r.int(23))
        job.retriedAt = r.optionalInt64(24)
        job.resultSource = try ResultSource(code: r.optionalInt(25))
        return job
    }

    static func node(_ r: Row) throws -> NodeRecord {
        guard let jobID = r.string(0), let id = r.string(2), let type = r.string(4) else {
            throw StoreError(.corrupt, "node without job id, id or type")
        }
        var node = NodeRecord(
            jobID: jobID, id: id, parent: r.string(3), position: r.int(1), type: type, state: try state(r, 5),
            attempts: r.int(6), startedAt: r.optionalInt64(7), finishedAt: r.optionalInt64(8),
            elapsedMs: r.optionalInt(9), status: r.optionalInt(10), error: try error(r, 12),
            recovered: r.int64(11) != 0, result: try r.json(13))
        node.request = try r.json(14)
        node.pages = r.optionalInt(15)
        node.resultSource = try ResultSource(code: r.optionalInt(16))
        return node
    }
}
