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
        // The private HTTP cache of `cache: "use"` fetches (API.md §9): one response per GET URL, the request's
        // values of its Vary fields beside it; `last_used` is a sequence number, the least recently used goes first.
        """
        CREATE TABLE IF NOT EXISTS http_cache (
            key TEXT NOT NULL PRIMARY KEY,
            vary_key TEXT NOT NULL,
            status INTEGER NOT NULL,
            url TEXT NOT NULL,
            http_version TEXT,
            request_time INTEGER NOT NULL,
            response_time INTEGER NOT NULL,
            last_used INTEGER NOT NULL,
            size INTEGER NOT NULL,
            headers TEXT NOT NULL,
            body BLOB NOT NULL
        );
        CREATE INDEX IF NOT EXISTS http_cache_last_used ON http_cache (last_used);
        """,
    ]

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
