import Foundation
import JobCore
import Threads

/// Counts answered HTTP requests by route pattern, method and status. Fed from the
/// server's `onResponse` hook on every event-loop thread, read by `/metrics`.
final class HTTPRequestCounter: @unchecked Sendable {
    // @unchecked: each shard's `counts` is only touched with that shard's `lock` held.
    /// One label set of `jobserver_http_requests_total`.
    struct Key: Hashable, Comparable {
        var route: String
        var method: String
        var status: Int

        static func < (a: Key, b: Key) -> Bool {
            (a.route, a.method, a.status) < (b.route, b.method, b.status)
        }
    }

    /// Event loops count into the shard their thread picks, so that two loops rarely wait for one lock.
    private final class Shard: @unchecked Sendable {
        // @unchecked: `counts` is read and written only with `lock` held.
        let lock = Lock()
        var counts: [Key: Int] = [:]
    }

    private let shards = (0..<8).map { _ in Shard() }

    /// Counts one response; `route` is the matched pattern, `nil` when no route matched.
    func record(route: String?, method: String, status: Int) {
        let key = Key(route: route ?? "unmatched", method: method, status: status)
        var hasher = Hasher()
        hasher.combine(pthread_self())
        let shard = shards[Int(UInt(bitPattern: hasher.finalize()) % UInt(shards.count))]
        shard.lock.lock()
        shard.counts[key, default: 0] += 1
        shard.lock.unlock()
    }

    /// The counts so far.
    var snapshot: [Key: Int] {
        var total: [Key: Int] = [:]
        for shard in shards {
            shard.lock.lock()
            let counts = shard.counts
            shard.lock.unlock()
            total.merge(counts, uniquingKeysWith: +)
        }
        return total
    }
}

/// Everything `/metrics` shows, copied out of the engine, the fetcher and the request counter.
struct MetricsSnapshot {
    var jobsByState: [NodeState: Int] = [:]
    var nodesByState: [NodeState: Int] = [:]
    var activeJobs = 0
    var pendingFetches = 0
    var fetchesInFlight = 0
    var jobLoadFailures = 0
    var longPollsWaiting = 0
    var scheduledJobs = 0
    var waitingForKey = 0
    var responseMemoryBytes = 0
    var activeNodes = 0
    /// Finished fetch attempts by outcome (`succeeded` or an error kind).
    var fetchOutcomes: [String: Int] = [:]
    /// Upper bounds of the latency buckets; a missing or infinite last bound is `+Inf`.
    var latencyBucketsMs: [Double] = []
    /// Attempts per bucket, not cumulative.
    var latencyCounts: [Int] = []
    var latencySumMs: Double = 0
    var latencyCount = 0
    var httpRequests: [HTTPRequestCounter.Key: Int] = [:]
    var transfer = TransferMetrics()

    init() {}

    init(engine: EngineMetrics, fetcher: FetcherStats, http: [HTTPRequestCounter.Key: Int]) {
        jobsByState = engine.jobsByState
        nodesByState = engine.nodesByState
        activeJobs = engine.activeJobs
        pendingFetches = engine.pendingFetches
        fetchesInFlight = engine.fetchesInFlight
        jobLoadFailures = engine.jobLoadFailures
        longPollsWaiting = engine.longPollsWaiting
        scheduledJobs = engine.scheduledJobs
        waitingForKey = engine.waitingForKey
        responseMemoryBytes = engine.responseMemoryBytes
        activeNodes = engine.activeNodes
        transfer = engine.transfer
        fetchOutcomes = fetcher.outcomes
        latencyBucketsMs = FetcherStats.latencyBoundsMs.map(Double.init)
        latencyCounts = fetcher.latencyCounts
        latencySumMs = Double(fetcher.latencySumMs)
        latencyCount = fetcher.completed
        httpRequests = http
    }
}

/// The Prometheus text exposition format, version 0.0.4.
enum PrometheusText {
    /// The `Content-Type` of `/metrics`.
    static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    /// Everything `/metrics` shows.
    static func render(_ m: MetricsSnapshot) -> String {
        var out = ""
        family(&out, "jobserver_jobs", "gauge", "Jobs by state.")
        for state in NodeState.allCases {
            sample(&out, "jobserver_jobs", [("state", state.rawValue)], Double(m.jobsByState[state] ?? 0))
        }
        family(&out, "jobserver_nodes", "gauge", "Nodes of active (pending or running) jobs by state.")
        for state in NodeState.allCases {
            sample(&out, "jobserver_nodes", [("state", state.rawValue)], Double(m.nodesByState[state] ?? 0))
        }
        family(&out, "jobserver_jobs_active", "gauge", "Pending and running jobs.")
        sample(&out, "jobserver_jobs_active", [], Double(m.activeJobs))
        family(&out, "jobserver_fetches_in_flight", "gauge", "Transfers in progress.")
        sample(&out, "jobserver_fetches_in_flight", [], Double(m.fetchesInFlight))
        family(&out, "jobserver_fetch_queue_depth", "gauge", "Fetches waiting for a transfer slot.")
        sample(&out, "jobserver_fetch_queue_depth", [], Double(m.pendingFetches))
        family(&out, "jobserver_jobs_load_failures_total", "counter", "Stored jobs that could not be loaded at start and were failed.")
        sample(&out, "jobserver_jobs_load_failures_total", [], Double(m.jobLoadFailures))
        family(&out, "jobserver_long_polls_waiting", "gauge", "Long-polls waiting for a job to change.")
        sample(&out, "jobserver_long_polls_waiting", [], Double(m.longPollsWaiting))
        family(&out, "jobserver_jobs_scheduled", "gauge", "Jobs waiting in the store for their not_before or for room (--max-active-nodes).")
        sample(&out, "jobserver_jobs_scheduled", [], Double(m.scheduledJobs))
        family(&out, "jobserver_jobs_waiting_for_key", "gauge", "Jobs waiting for a slot of their concurrency key.")
        sample(&out, "jobserver_jobs_waiting_for_key", [], Double(m.waitingForKey))
        family(&out, "jobserver_response_memory_bytes", "gauge", "Response body bytes the jobs in memory hold (bounded by --max-response-memory).")
        sample(&out, "jobserver_response_memory_bytes", [], Double(m.responseMemoryBytes))
        family(&out, "jobserver_active_nodes", "gauge", "Nodes of the jobs in memory (bounded by --max-active-nodes).")
        sample(&out, "jobserver_active_nodes", [], Double(m.activeNodes))

        family(&out, "jobserver_fetches_total", "counter", "Finished fetch attempts by outcome.")
        for outcome in m.fetchOutcomes.keys.sorted() {
            sample(&out, "jobserver_fetches_total", [("outcome", outcome)], Double(m.fetchOutcomes[outcome] ?? 0))
        }

        family(&out, "jobserver_fetch_duration_seconds", "histogram", "Fetch attempt durations.")
        var cumulative = 0
        var wroteInfinity = false
        for (i, count) in m.latencyCounts.enumerated() {
            cumulative += count
            let bound = i < m.latencyBucketsMs.count ? m.latencyBucketsMs[i] : Double.infinity
            if bound.isInfinite {
                wroteInfinity = true
                cumulative = max(cumulative, m.latencyCount)
            }
            let le = bound.isInfinite ? "+Inf" : number(bound / 1000)
            sample(&out, "jobserver_fetch_duration_seconds_bucket", [("le", le)], Double(cumulative))
            if wroteInfinity { break }
        }
        if !wroteInfinity {
            sample(&out, "jobserver_fetch_duration_seconds_bucket", [("le", "+Inf")], Double(m.latencyCount))
        }
        sample(&out, "jobserver_fetch_duration_seconds_sum", [], m.latencySumMs / 1000)
        sample(&out, "jobserver_fetch_duration_seconds_count", [], Double(m.latencyCount))

        family(&out, "jobserver_http_requests_total", "counter", "Answered HTTP requests by route, method and status.")
        for key in m.httpRequests.keys.sorted() {
            let labels = [("route", key.route), ("method", key.method), ("status", String(key.status))]
            sample(&out, "jobserver_http_requests_total", labels, Double(m.httpRequests[key] ?? 0))
        }
        renderTransfer(&out, m.transfer)
        return out
    }

    static func family(_ out: inout String, _ name: String, _ type: String, _ help: String) {
        out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    }

    static func sample(_ out: inout String, _ name: String, _ labels: [(String, String)], _ value: Double) {
        out += name
        if !labels.isEmpty {
            out += "{" + labels.map { "\($0.0)=\"\(escapeLabel($0.1))\"" }.joined(separator: ",") + "}"
        }
        out += " " + number(value) + "\n"
    }

    /// Label values escape backslash, double quote and line feed.
    static func escapeLabel(_ value: String) -> String {
        var out = ""
        for c in value {
            switch c {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(c)
            }
        }
        return out
    }

    /// Integers without a decimal point, others in Swift's shortest round-trip form.
    static func number(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }
}
