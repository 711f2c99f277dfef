/// A row of the webhook outbox whose delivery is due.
public struct WebhookDueRow: Sendable {
    public var jobID: String
    public var url: String
    public var delivery: String
    public var attempts: Int
    public var settledAt: Int64?
}

/// A job's delivery state as the outbox stores it.
public struct WebhookRowStatus: Sendable {
    public var state: String
    public var attempts: Int
    public var lastStatus: Int?
}

/// The `webhook_outbox` table of the store's database, on connections of its own: SQLite or PostgreSQL.
/// `due`, `delete` and `record` are called from the outbox's serial queue only; `status` from any thread.
public protocol WebhookOutboxDatabase: AnyObject, Sendable {
    func status(jobID: String) -> WebhookRowStatus?
    func due(nowMs: Int64, limit: Int) throws -> [WebhookDueRow]
    /// Drops the row of `delivery` (its job no longer exists).
    func delete(jobID: String, delivery: String) throws
    /// Writes one attempt's outcome, unless the job settled again meanwhile (a new delivery replaced this one).
    func record(jobID: String, delivery: String, state: String, status: Int?, error: String?, nextAttemptAt: Int64?) throws
    func close()
}

/// The outbox in the SQLite store's file.
public final class SQLiteWebhookOutboxDatabase: WebhookOutboxDatabase, @unchecked Sendable {
    // @unchecked: `writer` is used only from the outbox's serial queue; `reader` only with `readLock` held.
    private var writer: SQLiteConnection?
    private var reader: SQLiteConnection?
    private let readLock = StoreMonitor()

    public init(path: String) throws {
        writer = try SQLiteConnection(path: path, create: false, busyTimeoutMs: 5000)
        reader = try SQLiteConnection(path: path, create: false, busyTimeoutMs: 5000)
    }

    public func status(jobID: String) -> WebhookRowStatus? {
        readLock.withLock {
            guard let reader,
                let statement = try? reader.prepare("SELECT state, attempts, last_status FROM webhook_outbox WHERE job_id = ?1")
            else { return nil }
            defer { statement.reset() }
            statement.bind(1, jobID)
            guard (try? statement.step()) == true else { return nil }
            return WebhookRowStatus(
                state: statement.string(0) ?? "pending", attempts: statement.int(1), lastStatus: statement.optionalInt(2))
        }
    }

    public func due(nowMs: Int64, limit: Int) throws -> [WebhookDueRow] {
        guard let writer else { return [] }
        let statement = try writer.prepare(
            "SELECT job_id, url, delivery, attempts, settled_at FROM webhook_outbox "
                + "WHERE state = 'pending' AND next_attempt_at <= ?1 ORDER BY next_attempt_at LIMIT ?2")
        defer { statement.reset() }
        statement.bind(1, nowMs)
        statement.bind(2, Int64(limit))
        var out: [WebhookDueRow] = []
        while try statement.step() {
            guard let jobID = statement.string(0), let url = statement.string(1), let delivery = statement.string(2)
            else { continue }
            out.append(WebhookDueRow(
                jobID: jobID, url: url, delivery: delivery, attempts: statement.int(3), settledAt: statement.optionalInt64(4)))
        }
        return out
    }

    public func delete(jobID: String, delivery: String) throws {
        guard let writer else { return }
        let statement = try writer.prepare("DELETE FROM webhook_outbox WHERE job_id = ?1 AND delivery = ?2")
        defer { statement.reset() }
        statement.bind(1, jobID)
        statement.bind(2, delivery)
        try statement.run()
    }

    public func record(jobID: String, delivery: String, state: String, status: Int?, error: String?, nextAttemptAt: Int64?) throws {
        guard let writer else { return }
        let statement = try writer.prepare(
            "UPDATE webhook_outbox SET state = ?3, attempts = attempts + 1, last_status = ?4, last_error = ?5, "
                + "next_attempt_at = ?6 WHERE job_id = ?1 AND delivery = ?2")
        defer { statement.reset() }
        statement.bind(1, jobID)
        statement.bind(2, delivery)
        statement.bind(3, state)
        statement.bind(4, status)
        statement.bind(5, error)
        statement.bind(6, nextAttemptAt)
        try statement.run()
    }

    public func close() {
        writer?.close()
        writer = nil
        readLock.withLock {
            reader?.close()
            reader = nil
        }
    }
}

/// The outbox in the PostgreSQL store's database (the triggers of `PostgresSchema` write it).
public final class PostgresWebhookOutboxDatabase: WebhookOutboxDatabase, @unchecked Sendable {
    // @unchecked: `writer` is used only from the outbox's serial queue; `reader` only with `readLock` held.
    private var writer: PostgresConnection?
    private var reader: PostgresConnection?
    private let readLock = StoreMonitor()

    public init(url: String) throws {
        writer = try PostgresConnection(url: url)
        reader = try PostgresConnection(url: url)
    }

    public func status(jobID: String) -> WebhookRowStatus? {
        readLock.withLock {
            guard let reader,
                let rows = try? reader.run(
                    prepared: "outbox_status", "SELECT state, attempts, last_status FROM webhook_outbox WHERE job_id = $1",
                    [.text(jobID)]),
                let row = PGRows.rows(rows).first
            else { return nil }
            return WebhookRowStatus(state: row.string(0) ?? "pending", attempts: row.int(1), lastStatus: row.optionalInt(2))
        }
    }

    public func due(nowMs: Int64, limit: Int) throws -> [WebhookDueRow] {
        guard let writer else { return [] }
        let rows = try writer.run(
            prepared: "outbox_due",
            "SELECT job_id, url, delivery, attempts, settled_at FROM webhook_outbox "
                + "WHERE state = 'pending' AND next_attempt_at <= $1 ORDER BY next_attempt_at LIMIT $2",
            [.int(nowMs), .int(limit)])
        return PGRows.rows(rows).compactMap { row in
            guard let jobID = row.string(0), let url = row.string(1), let delivery = row.string(2) else { return nil }
            return WebhookDueRow(jobID: jobID, url: url, delivery: delivery, attempts: row.int(3), settledAt: row.optionalInt64(4))
        }
    }

    public func delete(jobID: String, delivery: String) throws {
        try writer?.run(
            prepared: "outbox_delete", "DELETE FROM webhook_outbox WHERE job_id = $1 AND delivery = $2",
            [.text(jobID), .text(delivery)])
    }

    public func record(
        jobID: String, delivery: String, state: String, status: Int?, error: String?, nextAttemptAt: Int64?
    ) throws {
        try writer?.run(
            prepared: "outbox_record",
            "UPDATE webhook_outbox SET state = $3, attempts = attempts + 1, last_status = $4, last_error = $5, "
                + "next_attempt_at = $6 WHERE job_id = $1 AND delivery = $2",
            [.text(jobID), .text(delivery), .text(state), PGRows.int(status), PGRows.text(error), PGRows.int(nextAttemptAt)])
    }

    public func close() {
        writer?.close()
        writer = nil
        readLock.withLock {
            reader?.close()
            reader = nil
        }
    }
}
