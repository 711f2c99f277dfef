import Foundation
import Threads

/// `concurrency_key` over all the servers of one database (API.md §8, §10; docs/store.md "Concurrency keys").
///
/// A job holds one of its key's slots from its admission until it settles: a row of `key_slots` for its current
/// `attempt` (a retry makes a new attempt, which holds nothing), or its state `running`. A pass over a key is one
/// statement, `jobserver_key_admit(key)` (migration 3): under a transaction advisory lock on the key, it drops the
/// slots of settled, retried and deleted jobs, counts the slots held, gives the oldest waiting jobs (by id, that
/// is by submission) a slot while the key has a free one, `NOTIFY`s their ids on `jobserver_admitted`, and returns
/// the jobs holding a slot that have not started and the first waiting ones in order.
///
/// Passes run on one serial queue, on a reader connection, after the commit of each batch that created, settled
/// or reset a keyed job (the writer asks), when a job of this server starts waiting, and at each heartbeat for
/// the keys this server has jobs waiting on (should a notification be lost). Requests merge while a pass runs.
final class PostgresKeyAdmission: @unchecked Sendable {
    // @unchecked: `requested`, `draining` and `closed` are touched only on `queue`; `readers` and `logger` are
    // thread-safe or immutable; the delegate and the count are `Locked`.
    private let readers: PostgresReaderPool
    private let logger: Logger
    /// This server's lease owner id: a server does not look again at the passes it ran itself.
    let owner: String
    private let queue = DispatchQueue(label: "jobserver.key-admission")
    private var requested: Set<String> = []
    private var draining = false
    private var closed = false
    private let delegateBox = Locked<WeakDelegate>(WeakDelegate())
    private let passCount = Locked(0)

    /// The channel of the jobs let in: the id of the server whose pass let them in, the key (its JSON text) and
    /// the ids (comma-separated), on three lines.
    static let admittedChannel = "jobserver_admitted"

    private struct WeakDelegate {
        weak var value: KeyAdmissionDelegate?
    }

    init(readers: PostgresReaderPool, owner: String, logger: Logger) {
        self.readers = readers
        self.owner = owner
        self.logger = logger
    }

    var delegate: KeyAdmissionDelegate? {
        get { delegateBox.withLock { $0.value } }
        set { delegateBox.withLock { $0.value = newValue } }
    }

    var passes: Int { passCount.withLock { $0 } }

    func request(_ keys: Set<String>) {
        guard !keys.isEmpty else { return }
        queue.async {
            guard !self.closed else { return }
            self.requested.formUnion(keys)
            guard !self.draining else { return }
            self.draining = true
            self.queue.async { self.drain() }
        }
    }

    func close() {
        queue.sync {
            closed = true
            requested.removeAll()
        }
    }

    /// Runs a pass over every key asked for, those asked for meanwhile included; on `queue`.
    private func drain() {
        // Bounded: each round takes every key asked for so far; requests come from finite work.
        rounds: for _ in 0..<10_000 {
            guard !closed, !requested.isEmpty else { break }
            let keys = requested
            requested.removeAll()
            for key in keys {
                do {
                    let (holders, waiting) = try pass(key)
                    delegate?.keyAdmission(key, holders: holders, waiting: waiting)
                } catch {
                    // The servers' heartbeats ask again for every key with jobs waiting. An unreachable database
                    // fails the other keys too, each after a connection attempt: they are left to those.
                    logger.warning("concurrency key admission failed", ["error": .string("\(error)")])
                    if let failure = error as? StoreError, failure.kind == .unavailable { break rounds }
                }
            }
        }
        draining = false
        if !requested.isEmpty, !closed {
            draining = true
            queue.async { self.drain() }
        }
    }

    /// One admission pass over `key` (its Swift value; the column holds its JSON text).
    func pass(_ key: String) throws -> (holders: [String], waiting: [String]) {
        let rows = try readers.with { db in
            try db.run(
                prepared: "key_admit", "SELECT slot_job, slot_place FROM jobserver_key_admit($1, $2)",
                [PGRows.jsonString(key), .text(owner)])
        }
        passCount.withLock { $0 += 1 }
        var holders: [String] = []
        var waiting: [(place: Int64, id: String)] = []
        for row in PGRows.rows(rows) {
            guard let id = row.string(0) else { continue }
            let place = row.int64(1)
            if place == 0 { holders.append(id) } else { waiting.append((place, id)) }
        }
        waiting.sort { $0.place < $1.place }
        return (holders, waiting.map(\.id))
    }

    /// A notification on `admittedChannel`: the jobs let in are begun by their owner, and, when another server
    /// let them in, this server's jobs waiting on the key move up.
    func heard(_ payload: String) {
        let parts = payload.split(separator: "\n", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return }
        let ids = parts[2].split(separator: ",").map(String.init)
        var key: String?
        if parts[0] != owner[...],
            let value = try? JSONValue.parse(Array(parts[1].utf8), maxDepth: 1), case .string(let decoded) = value
        {
            key = decoded
        }
        delegate?.jobsAdmitted(ids, key: key)
    }

    func queuePosition(jobID: String) throws -> Int? { try queuePositions([jobID])[jobID] }

    /// The places of those of `ids` that wait for a slot of their key, over all servers, in one statement.
    func queuePositions(_ ids: [String]) throws -> [String: Int] {
        guard !ids.isEmpty else { return [:] }
        return try readers.with { db in
            let rows = try db.run(
                prepared: "key_positions",
                "SELECT j.id, 1 + (SELECT count(*) FROM jobs w WHERE w.concurrency_key = j.concurrency_key "
                    + "AND w.state = 'pending' AND w.due_at IS NULL AND w.id < j.id AND NOT EXISTS ("
                    + "SELECT 1 FROM key_slots s WHERE s.job_id = w.id AND s.attempt = w.attempt)) "
                    + "FROM jobs j WHERE j.id = ANY($1::text[]) AND j.state = 'pending' AND j.due_at IS NULL "
                    + "AND j.concurrency_key IS NOT NULL AND NOT EXISTS ("
                    + "SELECT 1 FROM key_slots s WHERE s.job_id = j.id AND s.attempt = j.attempt)",
                [PostgresLeases.array(ids)])
            var places: [String: Int] = [:]
            for row in PGRows.rows(rows) { if let id = row.string(0) { places[id] = row.int(1) } }
            return places
        }
    }
}
