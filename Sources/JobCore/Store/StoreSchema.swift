/// The SQLite schema, as a list of migrations numbered by `PRAGMA user_version`.
///
/// Migration `n` takes a database at version `n - 1` to version `n`; each runs
/// in its own transaction together with the `user_version` bump, so a crash
/// leaves the file at one version or the next, never in between. Never edit a
/// released migration: append a new one.
enum StoreSchema {
    static let migrations: [String] = [
        // 1: jobs, nodes, bodies.
        //
        // Large JSON columns come last in each row so that reads of the small
        // columns (listings, counts) never touch their overflow pages.
        // No FOREIGN KEYs: deletes are explicit (job, then its nodes and bodies),
        // which spares every node insert a parent lookup.
        """
        CREATE TABLE jobs (
            id TEXT NOT NULL PRIMARY KEY,
            name TEXT,
            state TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            started_at INTEGER,
            finished_at INTEGER,
            deadline_ms INTEGER,
            version INTEGER NOT NULL,
            p_total INTEGER NOT NULL,
            p_pending INTEGER NOT NULL,
            p_running INTEGER NOT NULL,
            p_succeeded INTEGER NOT NULL,
            p_failed INTEGER NOT NULL,
            p_cancelled INTEGER NOT NULL,
            p_skipped INTEGER NOT NULL,
            idempotency_key TEXT UNIQUE,
            request_hash TEXT,
            error TEXT,
            metadata TEXT,
            result TEXT,
            request TEXT NOT NULL
        );
        CREATE INDEX jobs_state_id ON jobs (state, id);
        CREATE INDEX jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL;
        CREATE TABLE nodes (
            job_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            id TEXT NOT NULL,
            parent TEXT,
            type TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            started_at INTEGER,
            finished_at INTEGER,
            elapsed_ms INTEGER,
            status INTEGER,
            recovered INTEGER NOT NULL,
            error TEXT,
            result TEXT,
            PRIMARY KEY (job_id, position)
        ) WITHOUT ROWID;
        CREATE INDEX nodes_job_node ON nodes (job_id, id);
        CREATE TABLE bodies (
            job_id TEXT NOT NULL,
            node_id TEXT NOT NULL,
            content_type TEXT,
            bytes BLOB NOT NULL,
            PRIMARY KEY (job_id, node_id)
        );
        """,
        // 2: the request a fetch sent, so that it is shown on node reads and sent again unchanged after a restart.
        "ALTER TABLE nodes ADD COLUMN request TEXT;",
        // 3: the pages a paginated fetch has fetched (API.md §7.2), shown on node reads while it runs and after.
        "ALTER TABLE nodes ADD COLUMN pages INTEGER;",
        // 4: when and beside which jobs a job runs (API.md §8), and its runs. `due_at` is set while a job with a
        // future `not_before` waits in the store, not in memory; the partial index finds the next due ones.
        """
        ALTER TABLE jobs ADD COLUMN not_before INTEGER;
        ALTER TABLE jobs ADD COLUMN due_at INTEGER;
        ALTER TABLE jobs ADD COLUMN concurrency_key TEXT;
        ALTER TABLE jobs ADD COLUMN concurrency_limit INTEGER;
        ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE jobs ADD COLUMN retried_at INTEGER;
        CREATE INDEX jobs_due_at ON jobs (due_at, id) WHERE due_at IS NOT NULL;
        """,
        // 5: the outbox of `notify` webhooks (API.md §8): one row per job that asked for one. The triggers write it in
        // the transaction that inserts the job and in the one that settles it, so a settled job's delivery is as
        // durable as its state, whatever writes that state. SQLite's JSON functions raise an error on a document
        // nested deeper than about 1,000 levels, which would refuse the job: only a request that names `notify` is
        // parsed, and only once `json_valid` (which answers 0 instead) passed it; submissions keep a job with
        // `notify` within that depth (`NotifyParser.maxRequestDepth`).
        """
        CREATE TABLE webhook_outbox (
            job_id TEXT NOT NULL PRIMARY KEY,
            url TEXT NOT NULL,
            state TEXT NOT NULL,
            delivery TEXT,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_status INTEGER,
            last_error TEXT,
            settled_at INTEGER,
            next_attempt_at INTEGER
        );
        CREATE INDEX webhook_outbox_due ON webhook_outbox (next_attempt_at) WHERE state = 'pending';
        \(outboxTrigger("webhook_outbox_on_insert", on: "jobs", jobID: "id"))
        CREATE TRIGGER webhook_outbox_on_settle AFTER UPDATE OF state ON jobs
        WHEN NEW.state IN ('succeeded', 'failed', 'cancelled', 'skipped') AND OLD.state IN ('pending', 'running')
        BEGIN
            UPDATE webhook_outbox SET state = 'pending', delivery = NEW.id || '.' || NEW.version, attempts = 0,
                last_status = NULL, last_error = NULL, settled_at = coalesce(NEW.finished_at, 0), next_attempt_at = 0
            WHERE job_id = NEW.id;
        END;
        CREATE TRIGGER webhook_outbox_on_delete AFTER DELETE ON jobs
        BEGIN
            DELETE FROM webhook_outbox WHERE job_id = OLD.id AND state <> 'pending';
        END;
        """,
        // 6: map_items: the items each expanded `map` node resolved, and where its copies begin among the job's
        // nodes, written in the transaction that inserts the copies; a restart expands the map again from them.
        """
        CREATE TABLE IF NOT EXISTS map_items (
            job_id TEXT NOT NULL,
            node_id TEXT NOT NULL,
            first_position INTEGER NOT NULL,
            items TEXT NOT NULL,
            PRIMARY KEY (job_id, node_id)
        ) WITHOUT ROWID;
        """,
        // 7: the private HTTP cache of `cache: "use"` fetches (API.md §9), `HTTPCache.schema`.
        HTTPCache.schema,
        // 8: results stored once (`ResultSource`): `result_ref` says where a row's result comes from when its
        // `result` column does not hold it all — its children's results, its root's, or the stored response body.
        // NULL: `result` is the whole result, as in every row written before.
        """
        ALTER TABLE jobs ADD COLUMN result_ref INTEGER;
        ALTER TABLE nodes ADD COLUMN result_ref INTEGER;
        """,
        // 9: a job's submitted request in a table of its own, written once. SQLite rewrites a whole row on every
        // update, overflow pages and all, and a job's row is updated with each batch of its changes: with the request
        // in it, a job of 10,000 fetches wrote its 550 KB again with each of a few dozen commits, a cost that grows
        // with the square of the job's size. Rows written before keep theirs in `jobs.request`, which reads fall back
        // to (`Columns.request`); new rows leave it empty. The `notify` outbox row is made when the request is
        // inserted.
        """
        CREATE TABLE job_requests (
            job_id TEXT NOT NULL PRIMARY KEY,
            request TEXT NOT NULL
        );
        \(outboxTrigger("webhook_outbox_on_request", on: "job_requests", jobID: "job_id"))
        """,
    ]

    /// The trigger that adds the `waiting` outbox row of a job whose request, inserted into `table`, names a
    /// `notify.url` (migrations 5 and 9).
    private static func outboxTrigger(_ name: String, on table: String, jobID: String) -> String {
        """
        CREATE TRIGGER \(name) AFTER INSERT ON \(table)
        WHEN instr(NEW.request, '"notify"') > 0
            AND CASE WHEN json_valid(NEW.request) THEN json_type(NEW.request, '$.notify.url') = 'text' ELSE 0 END
        BEGIN
            INSERT OR REPLACE INTO webhook_outbox (job_id, url, state)
            VALUES (NEW.\(jobID), json_extract(NEW.request, '$.notify.url'), 'waiting');
        END;
        """
    }

    /// The version a fully migrated database has.
    static var currentVersion: Int { migrations.count }

    /// Brings the database on `connection` to `currentVersion`.
    /// - Throws: `StoreError.migrate` if a migration fails or the file is newer than this code.
    static func migrate(_ connection: SQLiteConnection, logger: Logger) throws {
        var version = try userVersion(connection)
        if version > currentVersion {
            throw StoreError(.migrate, "database schema version \(version) is newer than this server's \(currentVersion)")
        }
        while version < currentVersion {
            let next = version + 1
            do {
                try connection.execute("BEGIN IMMEDIATE")
                // Read again inside the write lock: another process may have migrated meanwhile.
                let seen = try userVersion(connection)
                if seen >= next {
                    try connection.execute("COMMIT")
                    version = seen
                    continue
                }
                try connection.execute(migrations[next - 1])
                try connection.execute("PRAGMA user_version = \(next)")
                try connection.execute("COMMIT")
            } catch let error as StoreError {
                if connection.inTransaction { try? connection.execute("ROLLBACK") }
                throw StoreError(.migrate, "migration to schema version \(next) failed: \(error.message)", sqliteCode: error.sqliteCode)
            }
            logger.info("store schema migrated", ["version": .int(next)])
            version = next
        }
    }

    static func userVersion(_ connection: SQLiteConnection) throws -> Int {
        let statement = try connection.prepare("PRAGMA user_version")
        defer { statement.reset() }
        guard try statement.step() else { throw StoreError(.migrate, "PRAGMA user_version returned no row") }
        return statement.int(0)
    }
}
