import Foundation

/// `--host-rate` over all the servers of one database (API.md §10): each limited host has one row of
/// `host_rates`, the earliest time (µs, on PostgreSQL's clock) its next start may be given out. One statement books
/// the next `k` starts of a host, `1/N` s (plus 5 %, as `HostRateLimiter`) apart, whichever server asks:
///
///     INSERT … ON CONFLICT (host) DO UPDATE SET next_start_us = GREATEST(next_start_us, now) + k × interval
///
/// and answers how long from now the first of them is, so a waiting fetch needs no retry: it sleeps (on this
/// class's queue, never the engine's) until its booked time. Booking is a virtual schedule (GCRA), so servers
/// that book in turn interleave their starts and no second holds more than `N` of them over all servers.
///
/// A server books only a few starts ahead of time per host (`lookahead`): a fetch cancelled or timed out while it
/// waits wastes its booked start, never exceeds the rate. Booked starts are handed out in the order the fetches
/// asked, which is the fetch queue's round-robin order.
final class PostgresHostRates: @unchecked Sendable {
    // @unchecked: every `var` is touched only on `queue`; `url` and `logger` are immutable.
    private let url: String
    private let logger: Logger
    private let queue = DispatchQueue(label: "jobserver.host-rates")
    private var connection: PostgresConnection?
    private var hosts: [String: Host] = [:]
    private var retryArmed = false
    private var nextTicket = 0
    private var closed = false
    static let retryMs = 50

    private struct Waiter {
        var jobID: String
        var completion: @Sendable (UInt64?) -> Void
        var intervalUs: Int64
    }

    private struct Host {
        /// Fetches with no booked start yet, in the order they asked.
        var waiting: [Waiter] = []
        /// The fetches whose booked start has not come yet, by ticket.
        var booked: [Int: Waiter] = [:]
        var isIdle: Bool { waiting.isEmpty && booked.isEmpty }
    }

    init(url: String, logger: Logger) {
        self.url = url
        self.logger = logger
    }

    /// Calls `completion` with how long (ns) the start was held back for the rate once `host` (a host name, as
    /// `HostRateLimiter.hostName`) may take one more start, over all servers; `nil` if the store closes first.
    func awaitStart(
        _ host: String, perSecond: Double, jobID: String, _ completion: @escaping @Sendable (UInt64?) -> Void
    ) {
        let intervalUs = max(1, Int64(1e6 / max(perSecond, 1e-6) * 1.05))
        queue.async {
            if self.closed { return completion(nil) }
            self.hosts[host, default: Host()].waiting.append(Waiter(jobID: jobID, completion: completion, intervalUs: intervalUs))
            self.book(host)
        }
    }

    /// The job's fetches waiting for a start are answered `nil` at once (their slots go back); the starts booked
    /// for them stay unused, and the host books for the fetches after them.
    func withdraw(jobID: String) {
        queue.async {
            for (host, entry) in self.hosts {
                var left = entry
                left.waiting.removeAll { $0.jobID == jobID }
                left.booked = left.booked.filter { $0.value.jobID != jobID }
                guard left.waiting.count != entry.waiting.count || left.booked.count != entry.booked.count else { continue }
                self.hosts[host] = left.isIdle ? nil : left
                for waiter in entry.waiting where waiter.jobID == jobID { waiter.completion(nil) }
                for waiter in entry.booked.values where waiter.jobID == jobID { waiter.completion(nil) }
                self.book(host)
            }
        }
    }

    func close() {
        queue.sync {
            closed = true
            for host in hosts.values {
                for waiter in host.waiting { waiter.completion(nil) }
                for waiter in host.booked.values { waiter.completion(nil) }
            }
            hosts.removeAll()
            connection?.close()
            connection = nil
        }
    }

    /// How many starts of a host this server books ahead: enough to cover a round trip (≈ 20 ms of starts at
    /// high rates), at least 2 so that the next booking overlaps the wait for the current one.
    static func lookahead(intervalUs: Int64) -> Int { max(2, Int(20_000 / max(intervalUs, 1))) }

    /// Books starts for the host's waiting fetches, up to the lookahead, in one statement; on `queue`.
    private func book(_ host: String) {
        guard !closed, var entry = hosts[host], let first = entry.waiting.first else { return }
        let count = min(entry.waiting.count, Self.lookahead(intervalUs: first.intervalUs) - entry.booked.count)
        guard count > 0 else { return }
        let intervalUs = first.intervalUs
        let firstWaitUs: Int64
        do {
            firstWaitUs = try reserve(host, count: count, intervalUs: intervalUs)
        } catch {
            lost(error)
            retryLater()
            return
        }
        let given = entry.waiting.prefix(count)
        entry.waiting.removeFirst(count)
        var tickets: [Int] = []
        for waiter in given {
            nextTicket += 1
            entry.booked[nextTicket] = waiter
            tickets.append(nextTicket)
        }
        hosts[host] = entry
        for (j, ticket) in tickets.enumerated() {
            let waitUs = max(0, firstWaitUs + Int64(j) * intervalUs)
            let fire: @Sendable () -> Void = { self.came(host, ticket, heldNs: UInt64(waitUs) * 1000) }
            if waitUs == 0 { fire() } else { queue.asyncAfter(deadline: .now() + .microseconds(Int(waitUs)), execute: fire) }
        }
    }

    /// A booked start came (unless the store closed meanwhile): its fetch may start, and the host book one more.
    private func came(_ host: String, _ ticket: Int, heldNs: UInt64) {
        guard var entry = hosts[host], let waiter = entry.booked.removeValue(forKey: ticket) else { return }
        hosts[host] = entry.isIdle ? nil : entry
        waiter.completion(heldNs)
        book(host)
    }

    /// Books `count` starts `intervalUs` apart; answers how long (µs) from now the first one is.
    private func reserve(_ host: String, count: Int, intervalUs: Int64) throws -> Int64 {
        let now = "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint"
        let rows = try open().run(
            prepared: "host_rate_book",
            "INSERT INTO host_rates AS r (host, next_start_us) VALUES ($1, \(now) + $2::bigint) "
                + "ON CONFLICT (host) DO UPDATE SET next_start_us = GREATEST(r.next_start_us, \(now)) + $2::bigint "
                + "RETURNING r.next_start_us - $2::bigint - \(now)",
            [.text(host), .int(Int64(count) * intervalUs)])
        guard let text = rows.rows.first?.first ?? nil, let wait = Int64(text) else {
            throw StoreError(.io, "booking a start of \(host) returned no time")
        }
        return wait
    }

    /// After a failed booking, every host with fetches waiting books again in a moment.
    private func retryLater() {
        guard !retryArmed else { return }
        retryArmed = true
        queue.asyncAfter(deadline: .now() + .milliseconds(Self.retryMs)) {
            self.retryArmed = false
            for host in self.hosts.keys { self.book(host) }
        }
    }

    private func lost(_ error: Error) {
        logger.warning("host rate booking failed; waiting fetches try again", ["error": .string("\(error)")])
        connection?.close()
        connection = nil
    }

    private func open() throws -> PostgresConnection {
        if let connection { return connection }
        let db = try PostgresConnection(url: url)
        connection = db
        return db
    }
}

extension PostgresJobStore: SharedHostRates {
    public func awaitHostStart(
        _ host: String, perSecond: Double, jobID: String, _ completion: @escaping @Sendable (UInt64?) -> Void
    ) {
        hostRates.awaitStart(host, perSecond: perSecond, jobID: jobID, completion)
    }

    public func withdrawHostStarts(jobID: String) { hostRates.withdraw(jobID: jobID) }
}
