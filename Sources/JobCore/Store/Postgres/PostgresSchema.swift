/// The PostgreSQL schema, as a list of migrations numbered by the one row of `jobserver_schema`.
///
/// The same tables and columns as the SQLite schema (`StoreSchema`), in PostgreSQL's dialect: integers are
/// `BIGINT`, JSON is its compact text (parsed in Swift as SQLite's is, so both stores read the same values), ids
/// sort in byte order (`COLLATE "C"`, as SQLite compares text) so that listings and cursors agree, and the
/// webhook outbox is written by PL/pgSQL triggers in the transactions that insert and settle a job. Each
/// migration runs in its own transaction with the version bump, under an advisory lock, so servers starting
/// together on one database migrate it once. Never edit a released migration: append a new one.
enum PostgresSchema {
    static let migrations: [String] = [
        // 1: jobs, nodes, bodies, the webhook outbox with its triggers, map items: SQLite's versions 1–6 at once.
        """
        CREATE TABLE jobs (
            id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
            name TEXT,
            state TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            started_at BIGINT,
            finished_at BIGINT,
            deadline_ms BIGINT,
            version BIGINT NOT NULL,
            p_total BIGINT NOT NULL,
            p_pending BIGINT NOT NULL,
            p_running BIGINT NOT NULL,
            p_succeeded BIGINT NOT NULL,
            p_failed BIGINT NOT NULL,
            p_cancelled BIGINT NOT NULL,
            p_skipped BIGINT NOT NULL,
            idempotency_key TEXT UNIQUE,
            request_hash TEXT,
            not_before BIGINT,
            due_at BIGINT,
            concurrency_key TEXT,
            concurrency_limit BIGINT,
            attempt BIGINT NOT NULL DEFAULT 1,
            retried_at BIGINT,
            error TEXT,
            metadata TEXT,
            result TEXT,
            request TEXT NOT NULL
        );
        CREATE INDEX jobs_state_id ON jobs (state, id);
        CREATE INDEX jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL;
        CREATE INDEX jobs_due_at ON jobs (due_at, id) WHERE due_at IS NOT NULL;
        CREATE TABLE nodes (
            job_id TEXT COLLATE "C" NOT NULL,
            position BIGINT NOT NULL,
            id TEXT COLLATE "C" NOT NULL,
            parent TEXT,
            type TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts BIGINT NOT NULL,
            started_at BIGINT,
            finished_at BIGINT,
            elapsed_ms BIGINT,
            status BIGINT,
            recovered BIGINT NOT NULL,
            pages BIGINT,
            error TEXT,
            result TEXT,
            request TEXT,
            PRIMARY KEY (job_id, position)
        );
        CREATE INDEX nodes_job_node ON nodes (job_id, id);
        CREATE TABLE bodies (
            job_id TEXT COLLATE "C" NOT NULL,
            node_id TEXT COLLATE "C" NOT NULL,
            content_type TEXT,
            bytes BYTEA NOT NULL,
            PRIMARY KEY (job_id, node_id)
        );
        CREATE TABLE map_items (
            job_id TEXT COLLATE "C" NOT NULL,
            node_id TEXT COLLATE "C" NOT NULL,
            first_position BIGINT NOT NULL,
            items TEXT NOT NULL,
            PRIMARY KEY (job_id, node_id)
        );
        CREATE TABLE webhook_outbox (
            job_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
            url TEXT NOT NULL,
            state TEXT NOT NULL,
            delivery TEXT,
            attempts BIGINT NOT NULL DEFAULT 0,
            last_status BIGINT,
            last_error TEXT,
            settled_at BIGINT,
            next_attempt_at BIGINT
        );
        CREATE INDEX webhook_outbox_due ON webhook_outbox (next_attempt_at) WHERE state = 'pending';
        CREATE FUNCTION webhook_outbox_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            doc jsonb;
        BEGIN
            -- Only a request that names notify is parsed; one PostgreSQL cannot parse (too deep) asks for nothing,
            -- as in SQLite, rather than refusing the job.
            IF strpos(NEW.request, '"notify"') = 0 THEN
                RETURN NULL;
            END IF;
            BEGIN
                doc := NEW.request::jsonb;
            EXCEPTION WHEN others THEN
                RETURN NULL;
            END;
            IF jsonb_typeof(doc -> 'notify' -> 'url') = 'string' THEN
                INSERT INTO webhook_outbox (job_id, url, state) VALUES (NEW.id, doc -> 'notify' ->> 'url', 'waiting')
                ON CONFLICT (job_id) DO UPDATE SET url = EXCLUDED.url, state = 'waiting', delivery = NULL,
                    attempts = 0, last_status = NULL, last_error = NULL, settled_at = NULL, next_attempt_at = NULL;
            END IF;
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER webhook_outbox_on_insert AFTER INSERT ON jobs
            FOR EACH ROW EXECUTE FUNCTION webhook_outbox_on_insert();
        CREATE FUNCTION webhook_outbox_on_settle() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE webhook_outbox SET state = 'pending', delivery = NEW.id || '.' || NEW.version, attempts = 0,
                last_status = NULL, last_error = NULL, settled_at = coalesce(NEW.finished_at, 0), next_attempt_at = 0
            WHERE job_id = NEW.id;
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER webhook_outbox_on_settle AFTER UPDATE OF state ON jobs
            FOR EACH ROW
            WHEN (NEW.state IN ('succeeded', 'failed', 'cancelled', 'skipped') AND OLD.state IN ('pending', 'running'))
            EXECUTE FUNCTION webhook_outbox_on_settle();
        CREATE FUNCTION webhook_outbox_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM webhook_outbox WHERE job_id = OLD.id AND state <> 'pending';
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER webhook_outbox_on_delete AFTER DELETE ON jobs
            FOR EACH ROW EXECUTE FUNCTION webhook_outbox_on_delete();
        """,
        // 2: leases (several servers on one database, API.md §10) and the durable cancel request.
        """
        ALTER TABLE jobs ADD COLUMN lease_owner TEXT, ADD COLUMN lease_generation BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN lease_expires_at BIGINT, ADD COLUMN cancel_requested_at BIGINT;
        CREATE INDEX jobs_unfinished_lease ON jobs (lease_expires_at) WHERE state IN ('pending', 'running');
        CREATE FUNCTION jobserver_now_ms() RETURNS BIGINT LANGUAGE sql VOLATILE AS $$
            SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
        $$;
        """,
        // 3: concurrency keys over all servers (API.md §8, §10): the slots held, and the admission of a key's
        // waiting jobs, serialized per key (docs/store.md "Concurrency keys").
        """
        CREATE TABLE key_slots (
            job_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
            concurrency_key TEXT NOT NULL,
            attempt BIGINT NOT NULL
        );
        CREATE INDEX key_slots_key ON key_slots (concurrency_key);
        CREATE INDEX jobs_key_unfinished ON jobs (concurrency_key, id)
            WHERE concurrency_key IS NOT NULL AND state IN ('pending', 'running');
        CREATE FUNCTION jobserver_key_admit(k TEXT, caller TEXT) RETURNS TABLE (slot_job TEXT, slot_place BIGINT)
        LANGUAGE plpgsql AS $$
        DECLARE
            held BIGINT;
            r RECORD;
            head TEXT := caller || E'\\n' || k || E'\\n';
            payload TEXT := '';
        BEGIN
            -- One admission of a key at a time over all servers; the statements after the lock see what the one
            -- before committed (each statement of a volatile function takes a new snapshot).
            PERFORM pg_advisory_xact_lock(7300013, hashtext(k));
            -- Settled, retried and deleted jobs give their slots back.
            DELETE FROM key_slots s WHERE s.concurrency_key = k AND NOT EXISTS (
                SELECT 1 FROM jobs j WHERE j.id = s.job_id AND j.attempt = s.attempt
                AND j.state IN ('pending', 'running'));
            SELECT count(*) INTO held FROM jobs j WHERE j.concurrency_key = k AND j.state IN ('pending', 'running')
                AND (j.state = 'running' OR EXISTS (
                    SELECT 1 FROM key_slots s WHERE s.job_id = j.id AND s.attempt = j.attempt));
            FOR r IN SELECT j.id, j.attempt, coalesce(j.concurrency_limit, 1) AS lim FROM jobs j
                WHERE j.concurrency_key = k AND j.state = 'pending' AND j.due_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM key_slots s WHERE s.job_id = j.id AND s.attempt = j.attempt)
                ORDER BY j.id LIMIT 1001
            LOOP
                EXIT WHEN held >= r.lim;
                INSERT INTO key_slots (job_id, concurrency_key, attempt) VALUES (r.id, k, r.attempt)
                    ON CONFLICT ON CONSTRAINT key_slots_pkey DO UPDATE SET concurrency_key = EXCLUDED.concurrency_key,
                    attempt = EXCLUDED.attempt;
                held := held + 1;
                IF length(payload) > 7000 - length(head) THEN
                    PERFORM pg_notify('jobserver_admitted', head || payload);
                    payload := '';
                END IF;
                payload := payload || CASE WHEN payload = '' THEN '' ELSE ',' END || r.id;
            END LOOP;
            -- The ids let in, after the server that let them in and the key: the other servers' jobs waiting on
            -- the key move up.
            IF payload <> '' THEN
                PERFORM pg_notify('jobserver_admitted', head || payload);
            END IF;
            -- The jobs holding a slot that have not started (place 0), then the first waiting ones in order.
            RETURN QUERY SELECT j.id::text, 0::bigint FROM jobs j JOIN key_slots s ON s.job_id = j.id
                AND s.attempt = j.attempt WHERE j.concurrency_key = k AND j.state = 'pending';
            RETURN QUERY SELECT w.id::text, row_number() OVER (ORDER BY w.id) FROM jobs w
                WHERE w.concurrency_key = k AND w.state = 'pending' AND w.due_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM key_slots s WHERE s.job_id = w.id AND s.attempt = w.attempt)
                ORDER BY w.id LIMIT 1000;
        END
        $$;
        """,
        // 4: `--host-rate` over all servers: the earliest time (µs since the epoch, PostgreSQL's clock) each limited
        // host's next request start may be booked for (`PostgresHostRates`). Unlogged: a booking then commits
        // without a WAL flush, and a crash of PostgreSQL that empties the table only lets the schedule start anew.
        """
        CREATE UNLOGGED TABLE host_rates (
            host TEXT COLLATE "C" NOT NULL PRIMARY KEY,
            next_start_us BIGINT NOT NULL
        );
        """,
        // 5: results stored once (`ResultSource`), as SQLite's version 8: `result_ref` says where a row's result
        // comes from when its `result` column does not hold it all. NULL: `result` is the whole result.
        """
        ALTER TABLE jobs ADD COLUMN result_ref BIGINT;
        ALTER TABLE nodes ADD COLUMN result_ref BIGINT;
        """,
    ]

    static var currentVersion: Int { migrations.count }

    /// Any fixed number, the same for every server: the key of the advisory lock migrations take.
    static let lockKey = 7_300_012

    /// Brings the database on `connection` to `currentVersion`.
    /// - Throws: `StoreError.migrate` if a migration fails or the database is newer than this code.
    static func migrate(_ connection: PostgresConnection, logger: Logger) throws {
        while true {
            var done = false
            do {
                try connection.transaction {
                    try connection.query("SELECT pg_advisory_xact_lock($1)", [.int(lockKey)])
                    try connection.execute("CREATE TABLE IF NOT EXISTS jobserver_schema (version BIGINT NOT NULL)")
                    let rows = try connection.execute("SELECT version FROM jobserver_schema")
                    let version: Int
                    if let text = rows.rows.first?.first ?? nil, let seen = Int(text) {
                        version = seen
                    } else {
                        try connection.execute("INSERT INTO jobserver_schema (version) VALUES (0)")
                        version = 0
                    }
                    if version > currentVersion {
                        throw StoreError(
                            .migrate, "database schema version \(version) is newer than this server's \(currentVersion)")
                    }
                    if version == currentVersion {
                        done = true
                        return
                    }
                    try connection.execute(migrations[version])
                    try connection.query("UPDATE jobserver_schema SET version = $1", [.int(version + 1)])
                    logger.info("store schema migrated", ["version": .int(version + 1)])
                }
            } catch let error as StoreError {
                if error.kind == .migrate { throw error }
                throw StoreError(.migrate, "migrating the PostgreSQL schema failed: \(error.message)")
            }
            if done { return }
        }
    }
}
