#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Threads

/// The leases this server holds on jobs in a shared PostgreSQL database (API.md §10, docs/store.md "Leases").
///
/// A lease is three columns of the job's row: `lease_owner` (this server's random id), `lease_generation` (raised
/// by every claim) and `lease_expires_at` (milliseconds on PostgreSQL's clock, so that servers' clocks need not
/// agree). The book keeps, for each job this server owns, the generation it claimed: the writer writes a job's
/// state only while the row still carries that generation (fencing), and the heartbeat renews exactly these rows.
final class PostgresLeases: Sendable {
    /// This server's id, new at every start: a restarted server owns nothing of its previous life.
    let owner: String
    let ttlMs: Int64
    private let state = Locked(State())
    private let delegateBox = Locked<WeakDelegate>(WeakDelegate())

    private struct State {
        var owned: [String: Int64] = [:]
        /// Jobs whose lease went to another server, with when (monotonic): their writes are dropped until the
        /// engine has let them go; kept a while longer, then forgotten.
        var lost: [String: Int64] = [:]
        /// Monotonic time until which the leases surely hold: the start of the last successful renewal plus the
        /// lease time (a renewal that began earlier than another server's clock says ends no later than it).
        var validUntilMs: Int64 = 0
    }

    private struct WeakDelegate {
        weak var value: SharedStoreDelegate?
    }

    enum Standing: Equatable {
        case owned(Int64)
        case lost
        case unknown
    }

    init(ttlMs: Int64) {
        var random = SystemRandomNumberGenerator()
        owner = "js-" + String(random.next(), radix: 36) + String(random.next(), radix: 36)
        self.ttlMs = ttlMs
        let until = Timestamp.monotonicMs() + ttlMs
        state.withLock { $0.validUntilMs = until }
    }

    var delegate: SharedStoreDelegate? {
        get { delegateBox.withLock { $0.value } }
        set { delegateBox.withLock { $0.value = newValue } }
    }

    func standing(of id: String) -> Standing {
        state.withLock { s in
            if let generation = s.owned[id] { return .owned(generation) }
            return s.lost[id] != nil ? .lost : .unknown
        }
    }

    /// Jobs this server now owns at these generations (created, adopted by a write, or claimed).
    func own(_ generations: [String: Int64]) {
        guard !generations.isEmpty else { return }
        state.withLock { s in
            for (id, generation) in generations {
                s.owned[id] = generation
                s.lost[id] = nil
            }
        }
    }

    /// These jobs' leases are gone, if still at the generations seen; tells the delegate.
    func lose(_ ids: [String: Int64?]) {
        guard !ids.isEmpty else { return }
        let now = Timestamp.monotonicMs()
        let gone: [String] = state.withLock { s in
            var gone: [String] = []
            for (id, seen) in ids {
                if let seen, s.owned[id] != seen { continue }
                s.owned[id] = nil
                s.lost[id] = now
                gone.append(id)
            }
            // A lost job's writes stop coming within seconds (the engine drops its run); ten minutes is ample.
            if s.lost.count > 1024 { s.lost = s.lost.filter { now - $0.value < 600_000 } }
            return gone
        }
        if !gone.isEmpty { delegate?.leasesLost(gone) }
    }

    func release(_ id: String) {
        state.withLock { _ = $0.owned.removeValue(forKey: id) }
    }

    var ownedSnapshot: [String: Int64] { state.withLock { $0.owned } }

    func renewed(beganAtMs: Int64) {
        let until = beganAtMs + ttlMs
        state.withLock { $0.validUntilMs = max($0.validUntilMs, until) }
    }

    /// Whether transfers may begin: the leases hold for at least a third of the lease time more. A transfer begun
    /// now then has that long to end before another server can claim its job: a paused or starved server stops
    /// beginning fetches two renewals before its jobs can be taken, not at the moment they can.
    var hold: Bool { state.withLock { Timestamp.monotonicMs() < $0.validUntilMs - ttlMs / 3 } }

    /// A PostgreSQL `text[]` literal of `ids`.
    static func array<S: Sequence>(_ ids: S) -> PostgresParameter where S.Element == String {
        var text = "{"
        var first = true
        for id in ids {
            if !first { text += "," }
            first = false
            text += "\""
            for c in id { if c == "\"" || c == "\\" { text += "\\" }; text.append(c) }
            text += "\""
        }
        return .text(text + "}")
    }

    /// Ends these leases now (a clean shutdown): other servers claim the jobs at their next heartbeat.
    func release(_ ids: [String], _ db: PostgresConnection) throws {
        try Self.inChunks(ids) { chunk in
            try db.query(
                "UPDATE jobs SET lease_expires_at = 0 WHERE lease_owner = $1 AND id = ANY($2::text[])",
                [.text(owner), PostgresLeases.array(chunk)])
        }
    }

    /// Runs `body` on `ids` in slices small enough for one statement's array parameter.
    static func inChunks(_ ids: [String], _ body: (ArraySlice<String>) throws -> Void) rethrows {
        var start = 0
        while start < ids.count {
            let chunk = ids[start..<min(ids.count, start + 5000)]
            start += chunk.count
            try body(chunk)
        }
    }

    /// PostgreSQL's clock in milliseconds, the only clock leases are compared with.
    static let nowMs = "jobserver_now_ms()"
    /// A cancel asked for this attempt of the job (one asked before a retry is not).
    static func cancelAsked(_ table: String = "") -> String {
        "(\(table)cancel_requested_at IS NOT NULL AND \(table)cancel_requested_at >= coalesce(\(table)retried_at, 0) "
            + "AND \(table)state IN \(PostgresJobStore.unfinished))"
    }
    /// Channels: a job changed (payload: ids, comma-separated), a cancel was asked for (payload: one id).
    static let changedChannel = "jobserver_jobs"
    static let cancelChannel = "jobserver_cancel"
}

/// The lease thread: on its own connection it listens for other servers' changes and cancels, renews this
/// server's leases every third of the lease time and then claims jobs whose lease expired.
final class PostgresLeaseKeeper: @unchecked Sendable {
    // @unchecked: `connection` and `nextBeatMs` are touched only on the keeper's thread; `stopped` is `Locked`;
    // `thread` is set in `start` and joined by `stop`, both called once by the store under its close monitor;
    // `onAdmitted` is set before `start` (whose thread creation orders the write before every read) and then only
    // read on the keeper's thread.
    private let url: String
    private let leases: PostgresLeases
    private let logger: Logger
    private let load: ([String], PostgresConnection) throws -> (jobs: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob])
    private var connection: PostgresConnection?
    private let stopped = Locked(false)
    private var thread: StoreThread?
    private var nextBeatMs: Int64 = 0
    /// Hears the notifications of jobs a concurrency key admission let in (`PostgresKeyAdmission.heard`); set
    /// before `start`.
    var onAdmitted: ((String) -> Void)?
    /// Jobs claimed per statement; a server with more to take claims again at once.
    static let claimBatch = 200

    init(
        url: String, leases: PostgresLeases, logger: Logger,
        load: @escaping ([String], PostgresConnection) throws -> (jobs: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob])
    ) {
        self.url = url
        self.leases = leases
        self.logger = logger
        self.load = load
    }

    func start() throws {
        thread = try StoreThread(name: "store-leases") { [self] in run() }
    }

    func stop() {
        stopped.withLock { $0 = true }
        thread?.join()
        thread = nil
    }

    private var isStopped: Bool { stopped.withLock { $0 } }

    private func run() {
        let beatMs = max(100, leases.ttlMs / 3)
        while !isStopped {
            do {
                let db = try open()
                let now = Timestamp.monotonicMs()
                if now >= nextBeatMs {
                    nextBeatMs = now + beatMs
                    try beat(db)
                }
                let wait = Int32(max(1, min(200, nextBeatMs - Timestamp.monotonicMs())))
                handle(try db.notifications(timeoutMs: wait))
            } catch {
                logger.warning("lease keeper lost its connection; trying again", ["error": .string("\(error)")])
                connection?.close()
                connection = nil
                for _ in 0..<5 where !isStopped { usleep(100_000) }
            }
        }
        connection?.close()
        connection = nil
    }

    private func open() throws -> PostgresConnection {
        if let connection { return connection }
        let db = try PostgresConnection(url: url)
        try db.listen(PostgresLeases.changedChannel)
        try db.listen(PostgresLeases.cancelChannel)
        try db.listen(PostgresKeyAdmission.admittedChannel)
        connection = db
        // Changes made while nobody listened are seen by the waiters' own polls.
        return db
    }

    private func handle(_ notes: [PostgresNotification]) {
        guard !notes.isEmpty, let delegate = leases.delegate else { return }
        var changed: [String] = []
        var cancels: [String] = []
        var admitted: [String] = []  // payloads
        for note in notes {
            if note.channel == PostgresKeyAdmission.admittedChannel {
                admitted.append(note.payload)
            } else if note.channel == PostgresLeases.cancelChannel {
                cancels.append(note.payload)
            } else {
                changed.append(contentsOf: note.payload.split(separator: ",").map(String.init))
            }
        }
        if !cancels.isEmpty { delegate.cancelRequested(cancels) }
        if !changed.isEmpty { delegate.jobsChanged(changed) }
        for payload in admitted { onAdmitted?(payload) }
    }

    /// Renews, then claims.
    private func beat(_ db: PostgresConnection) throws {
        try renew(db)
        var rounds = 0
        while rounds < 10, !isStopped, try claim(db) == Self.claimBatch { rounds += 1 }
    }

    private func renew(_ db: PostgresConnection) throws {
        let began = Timestamp.monotonicMs()
        let owned = leases.ownedSnapshot
        var seen: [String: (generation: Int64, cancel: Bool)] = [:]
        try PostgresLeases.inChunks(Array(owned.keys)) { chunk in
            // The rows are locked in id order, as the writer's fence locks them: in another order (a sequential
            // scan's) the two deadlock, and PostgreSQL takes a second (deadlock_timeout) to break each one, long
            // enough for the leases to expire under another server while this one still runs their jobs.
            let rows = try db.run(
                prepared: "lease_renew",
                "WITH r AS (SELECT id FROM jobs WHERE lease_owner = $1 AND id = ANY($3::text[]) ORDER BY id FOR UPDATE) "
                    + "UPDATE jobs j SET lease_expires_at = \(PostgresLeases.nowMs) + $2 FROM r WHERE j.id = r.id "
                    + "RETURNING j.id, j.lease_generation, \(PostgresLeases.cancelAsked("j."))",
                [.text(leases.owner), .int(leases.ttlMs), PostgresLeases.array(chunk)])
            for row in PGRows.rows(rows) {
                guard let id = row.string(0) else { continue }
                seen[id] = (row.int64(1), row.string(2) == "t")
            }
        }
        leases.renewed(beganAtMs: began)
        var lost: [String: Int64?] = [:]
        for (id, generation) in owned where seen[id]?.generation != generation { lost[id] = generation }
        leases.lose(lost)
        let cancels = seen.filter { $0.value.cancel }.map(\.key)
        if let delegate = leases.delegate {
            delegate.leasesRenewed()
            if !cancels.isEmpty { delegate.cancelRequested(cancels) }
        }
    }

    /// Claims up to `claimBatch` unfinished jobs whose lease expired (or that no server holds) and hands them to
    /// the engine; returns how many.
    private func claim(_ db: PostgresConnection) throws -> Int {
        let rows = try db.run(
            prepared: "lease_claim",
            "WITH c AS (SELECT id FROM jobs WHERE state IN \(PostgresJobStore.unfinished) AND due_at IS NULL "
                + "AND (lease_expires_at IS NULL OR lease_expires_at < \(PostgresLeases.nowMs)) "
                + "AND lease_owner IS DISTINCT FROM $1 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) "
                + "UPDATE jobs j SET lease_owner = $1, lease_generation = j.lease_generation + 1, "
                + "lease_expires_at = \(PostgresLeases.nowMs) + $2 FROM c WHERE j.id = c.id "
                + "RETURNING j.id, j.lease_generation, \(PostgresLeases.cancelAsked("j."))",
            [.text(leases.owner), .int(leases.ttlMs), .int(Self.claimBatch)])
        var claimed: [String: Int64] = [:]
        var cancels: Set<String> = []
        for row in PGRows.rows(rows) {
            guard let id = row.string(0) else { continue }
            claimed[id] = row.int64(1)
            if row.string(2) == "t" { cancels.insert(id) }
        }
        guard !claimed.isEmpty else { return 0 }
        leases.own(claimed)
        logger.info("claimed jobs whose lease expired", ["jobs": .int(claimed.count)])
        let loaded = try load(Array(claimed.keys), db)
        if let delegate = leases.delegate {
            delegate.jobsClaimed(loaded.jobs, unreadable: loaded.unreadable, cancelRequested: cancels)
        } else {
            // No engine to run them: let them go again at once.
            try leases.release(Array(claimed.keys), db)
        }
        return claimed.count
    }

}
