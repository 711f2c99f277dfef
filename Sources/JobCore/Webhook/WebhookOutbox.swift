import Foundation
import Threads

/// Settings of the webhook deliveries.
public struct WebhookConfiguration: Sendable {
    /// Signs each body with HMAC-SHA256 under this key (`--webhook-secret`); unsigned when `nil`.
    public var secret: [UInt8]?
    /// Failed attempts are retried until this long after the job settled (`--webhook-retry-for`).
    public var retryForMs: Int64 = 86_400_000
    /// The wait after the first failed attempt; it doubles each attempt (with jitter) up to `maxBackoffMs`.
    public var firstBackoffMs: Int64 = 500
    public var maxBackoffMs: Int64 = 300_000
    /// How often the outbox is looked at for deliveries that are due.
    public var pollIntervalMs = 200
    /// One attempt's time limit, connect included.
    public var attemptTimeoutMs = 10_000

    public init() {}
}

/// Counts of webhook attempts by outcome, for `/metrics`.
public struct WebhookStats: Sendable, Equatable {
    /// Deliveries answered 2xx.
    public var delivered = 0
    /// Attempts that failed and will be made again.
    public var retried = 0
    /// Deliveries given up: out of time, a denied address, or the job was deleted.
    public var failed = 0

    public init() {}
}

/// Delivers `notify` webhooks from the store's outbox (API.md §8).
///
/// A job's row is written by triggers in the transactions that create and settle the job (StoreSchema, migration 3),
/// so a settled job's delivery is on disk exactly when its state is. This reads the rows that are due, POSTs each
/// through the shared `Fetcher` (so `--deny-cidr` is checked on the address connected to), and records each attempt;
/// a row is `pending` until an answer in 2xx or until `retryForMs` after the settle, so a delivery cut short by a
/// crash is made again after the restart: at least once.
public final class WebhookOutbox: @unchecked Sendable {
    // @unchecked: `database` is set on `queue` and read with `readLock` held; `inFlight`, `timer` and `stopped` are
    // touched only on `queue`; `stats` is a Locked; the rest is immutable.
    private let openDatabase: @Sendable () throws -> WebhookOutboxDatabase
    private let fetcher: Fetcher
    private let store: JobStore
    private let configuration: WebhookConfiguration
    private let logger: Logger
    private let render: @Sendable (JobRecord) -> [UInt8]
    private let queue = DispatchQueue(label: "jobserver.webhooks")
    private var inFlight: Set<String> = []
    private var timer: DispatchSourceTimer?
    private var stopped = false
    private let readLock = Lock()
    private var database: WebhookOutboxDatabase?
    private let counters = Locked(WebhookStats())
    /// Called with a job's id after its delivery state changed (the engine drops its cached answer).
    private let onChange: @Sendable (String) -> Void

    /// - Parameters:
    ///   - path: the SQLite file the store uses (migrated by it already).
    ///   - store: read for the job to send.
    ///   - render: the body of a delivery: the job object without `result`.
    ///   - onChange: told of each job whose delivery state changed.
    public convenience init(
        path: String, store: JobStore, fetcher: Fetcher, configuration: WebhookConfiguration, logger: Logger,
        render: @escaping @Sendable (JobRecord) -> [UInt8], onChange: @escaping @Sendable (String) -> Void
    ) {
        self.init(
            database: { try SQLiteWebhookOutboxDatabase(path: path) }, store: store, fetcher: fetcher,
            configuration: configuration, logger: logger, render: render, onChange: onChange)
    }

    /// As `init(path:…)`, on the outbox table `database` opens (the PostgreSQL store's, or SQLite's).
    public init(
        database: @escaping @Sendable () throws -> WebhookOutboxDatabase, store: JobStore, fetcher: Fetcher, configuration: WebhookConfiguration, logger: Logger,
        render: @escaping @Sendable (JobRecord) -> [UInt8], onChange: @escaping @Sendable (String) -> Void
    ) {
        self.openDatabase = database
        self.store = store
        self.fetcher = fetcher
        self.configuration = configuration
        self.logger = logger
        self.render = render
        self.onChange = onChange
    }

    /// Opens the outbox and starts delivering what is due, the deliveries a restart left pending first.
    /// - Throws: `StoreError` when the file cannot be opened.
    public func start() throws {
        let database = try openDatabase()
        readLock.withLock { self.database = database }
        let interval = max(10, configuration.pollIntervalMs)
        queue.sync {
            let timer = DispatchSource.makeTimerSource(queue: queue)
            timer.schedule(deadline: .now(), repeating: .milliseconds(interval))
            timer.setEventHandler { [weak self] in self?.deliverDue() }
            self.timer = timer
            timer.resume()
        }
    }

    /// Stops starting deliveries; those in flight are cut short and made again after the next start.
    public func stop() {
        queue.sync {
            stopped = true
            timer?.cancel()
            timer = nil
        }
        let database = readLock.withLock { () -> WebhookOutboxDatabase? in
            defer { self.database = nil }
            return self.database
        }
        database?.close()
    }

    /// Counts by outcome.
    public var stats: WebhookStats { counters.withLock { $0 } }

    /// The delivery state the job object shows; `nil` for a job that asked for no webhook. Reads the outbox: for a
    /// read queue, not an event loop.
    public func status(jobID: String) -> NotifyStatus? {
        guard let row = readLock.withLock({ database })?.status(jobID: jobID) else { return nil }
        return NotifyStatus(
            state: row.state == "waiting" ? "pending" : row.state, attempts: row.attempts, lastStatus: row.lastStatus)
    }

    // MARK: - On the queue

    private struct Due {
        var jobID: String
        var url: String
        var delivery: String
        var attempts: Int
        var settledAt: Int64
    }

    private func deliverDue() {
        guard !stopped, let database = readLock.withLock({ database }) else { return }
        let now = Timestamp.nowMs()
        var due: [Due] = []
        do {
            for row in try database.due(nowMs: now, limit: 256) where !inFlight.contains(row.delivery) {
                due.append(Due(jobID: row.jobID, url: row.url, delivery: row.delivery, attempts: row.attempts,
                               settledAt: row.settledAt ?? now))
            }
        } catch {
            logger.error("webhook outbox could not be read", ["error": .string("\(error)")])
            return
        }
        for item in due { attempt(item) }
    }

    private func attempt(_ item: Due) {
        let job: JobRecord?
        do {
            job = try store.jobWithoutRequest(id: item.jobID)
        } catch {
            logger.error("webhook job could not be read", ["job": .string(item.jobID), "error": .string("\(error)")])
            return
        }
        guard let job else {
            // Deleted while its delivery was pending (the delete trigger keeps pending rows): nothing left to send.
            forget(item)
            return
        }
        let body = render(job)
        var headers: [(name: String, value: String)] = [
            ("Content-Type", "application/json"), ("X-Jobserver-Event", "job.settled"),
            ("X-Jobserver-Delivery", item.delivery),
        ]
        if let secret = configuration.secret {
            headers.append(("X-Jobserver-Signature", "sha256=" + SHA256.hex(SHA256.hmac(key: secret, message: body))))
        }
        let request = FetchRequest(
            url: item.url, method: "POST", headers: headers, body: .text(String(decoding: body, as: UTF8.self)),
            expect: .bytes, retries: 0, idempotent: true, maxBytes: 64 * 1024, followRedirects: false)
        inFlight.insert(item.delivery)
        fetcher.start(request, timeoutMs: configuration.attemptTimeoutMs) { [weak self] outcome in
            guard let self else { return }
            self.queue.async { self.finished(item, outcome) }
        }
    }

    private func finished(_ item: Due, _ outcome: FetchOutcome) {
        inFlight.remove(item.delivery)
        guard !stopped else { return }
        let status: Int?
        let problem: String
        switch outcome.result {
        case .success(let response):
            record(item, state: "delivered", status: response.status, error: nil, nextAttemptAt: nil)
            return
        case .failure(let error):
            status = error.status ?? outcome.lastResponse?.status
            problem = error.message
            // The address is refused before any connection: trying again would meet the same refusal.
            if error.kind == .connect, error.message.contains(" is denied") {
                record(item, state: "failed", status: nil, error: problem, nextAttemptAt: nil)
                return
            }
        }
        let now = Timestamp.nowMs()
        let attempts = item.attempts + 1
        var backoff = configuration.firstBackoffMs
        for _ in 1..<min(attempts, 32) {
            backoff = min(configuration.maxBackoffMs, backoff * 2)
        }
        backoff += Int64.random(in: 0...max(1, backoff / 5))
        if now + backoff > item.settledAt + configuration.retryForMs {
            record(item, state: "failed", status: status, error: problem, nextAttemptAt: nil)
        } else {
            record(item, state: "pending", status: status, error: problem, nextAttemptAt: now + backoff)
        }
    }

    /// Drops the row of a job that no longer exists, counted as failed.
    private func forget(_ item: Due) {
        guard let database = readLock.withLock({ database }) else { return }
        do {
            try database.delete(jobID: item.jobID, delivery: item.delivery)
        } catch {
            logger.error("webhook row could not be deleted", ["job": .string(item.jobID), "error": .string("\(error)")])
            return
        }
        counters.withLock { $0.failed += 1 }
        logger.info("webhook dropped: the job was deleted", ["job": .string(item.jobID), "delivery": .string(item.delivery)])
    }

    /// Writes one attempt's outcome, unless the job settled again meanwhile (a new delivery replaced this one).
    private func record(_ item: Due, state: String, status: Int?, error: String?, nextAttemptAt: Int64?) {
        guard let database = readLock.withLock({ database }) else { return }
        do {
            try database.record(
                jobID: item.jobID, delivery: item.delivery, state: state, status: status, error: error,
                nextAttemptAt: nextAttemptAt)
        } catch {
            logger.error("webhook outcome could not be written", ["job": .string(item.jobID), "error": .string("\(error)")])
            return
        }
        counters.withLock { stats in
            switch state {
            case "delivered": stats.delivered += 1
            case "failed": stats.failed += 1
            default: stats.retried += 1
            }
        }
        let fields: KeyValuePairs<String, JSONValue> = [
            "job": .string(item.jobID), "delivery": .string(item.delivery), "state": .string(state),
            "status": status.map { .int($0) } ?? .null, "error": error.map(JSONValue.string) ?? .null,
        ]
        // The change first: whoever reads the line then finds the job showing it.
        onChange(item.jobID)
        if state == "pending" { logger.debug("webhook attempt failed", fields) } else { logger.info("webhook", fields) }
    }
}
