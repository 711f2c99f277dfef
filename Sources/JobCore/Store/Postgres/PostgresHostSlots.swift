import Foundation

/// `--max-per-host` over all the servers of one database (API.md §10): a host's transfer slots are PostgreSQL
/// session advisory locks `(hash of the host, slot)`, slot from 0 to the limit − 1, held on this server's own
/// connection while its transfers run. One statement takes any free slot (`pg_try_advisory_lock` over the slots,
/// stopping at the first it gets); a dead server's slots are freed when PostgreSQL sees its session end.
///
/// Slots are interchangeable, so a release gives back any slot this server holds for the host. A host whose slots
/// are all taken is tried again every 50 ms, first come first served among this server's waiting fetches.
final class PostgresHostSlots: @unchecked Sendable {
    // @unchecked: every `var` is touched only on `queue`; `url` and `logger` are immutable.
    private let url: String
    private let logger: Logger
    private let queue = DispatchQueue(label: "jobserver.host-slots")
    private var connection: PostgresConnection?
    private var held: [String: [Int32]] = [:]
    private var waiting: [(host: String, limit: Int, completion: @Sendable (Bool) -> Void)] = []
    private var retryArmed = false
    private var closed = false
    static let retryMs = 50

    init(url: String, logger: Logger) {
        self.url = url
        self.logger = logger
    }

    func acquire(_ host: String, limit: Int, _ completion: @escaping @Sendable (Bool) -> Void) {
        queue.async {
            if self.closed { return completion(false) }
            self.waiting.append((host, max(1, limit), completion))
            self.serveWaiting()
        }
    }

    func release(_ host: String) {
        queue.async {
            guard var slots = self.held[host], let slot = slots.popLast() else { return }
            self.held[host] = slots.isEmpty ? nil : slots
            do {
                try self.open().run(
                    prepared: "host_slot_unlock", "SELECT pg_advisory_unlock($1::int, $2::int)",
                    [.int(Int(Self.key(host))), .int(Int(slot))])
            } catch {
                self.lost(error)
            }
            self.serveWaiting()
        }
    }

    func close() {
        queue.sync {
            closed = true
            for entry in waiting { entry.completion(false) }
            waiting.removeAll()
            connection?.close()
            connection = nil
            held.removeAll()
        }
    }

    /// Gives a slot to each waiting fetch whose host has one free, in arrival order; on `queue`.
    private func serveWaiting() {
        guard !waiting.isEmpty else { return }
        var full: Set<String> = []
        var still: [(host: String, limit: Int, completion: @Sendable (Bool) -> Void)] = []
        for entry in waiting {
            if full.contains(entry.host) || !take(entry.host, limit: entry.limit) {
                full.insert(entry.host)
                still.append(entry)
            } else {
                entry.completion(true)
            }
        }
        waiting = still
        if !waiting.isEmpty && !retryArmed {
            retryArmed = true
            queue.asyncAfter(deadline: .now() + .milliseconds(Self.retryMs)) {
                self.retryArmed = false
                if !self.closed { self.serveWaiting() }
            }
        }
    }

    private func take(_ host: String, limit: Int) -> Bool {
        do {
            // A session gets a lock it holds again (they count up), so the slots this server holds are skipped;
            // CASE, unlike AND, evaluates in order.
            let mine = "{" + (held[host] ?? []).map(String.init).joined(separator: ",") + "}"
            let rows = try open().run(
                prepared: "host_slot_lock",
                "SELECT s FROM generate_series(0, $2::int - 1) AS s WHERE CASE WHEN s = ANY($3::int[]) THEN false "
                    + "ELSE pg_try_advisory_lock($1::int, s) END LIMIT 1",
                [.int(Int(Self.key(host))), .int(limit), .text(mine)])
            guard let text = rows.rows.first?.first ?? nil, let slot = Int32(text) else { return false }
            held[host, default: []].append(slot)
            return true
        } catch {
            lost(error)
            return false
        }
    }

    /// The connection went: its locks went with it. The transfers running keep going; later ones take slots anew.
    private func lost(_ error: Error) {
        logger.warning("host slots connection failed; its slots are given up", ["error": .string("\(error)")])
        connection?.close()
        connection = nil
        held.removeAll()
    }

    private func open() throws -> PostgresConnection {
        if let connection { return connection }
        let db = try PostgresConnection(url: url)
        connection = db
        return db
    }

    /// FNV-1a of the host key, as PostgreSQL's `int4`: hosts that collide share their slots (never more at once).
    static func key(_ host: String) -> Int32 {
        var hash: UInt32 = 2_166_136_261
        for byte in host.utf8 {
            hash ^= UInt32(byte)
            hash = hash &* 16_777_619
        }
        return Int32(bitPattern: hash)
    }
}
