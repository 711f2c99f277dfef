// STAND-IN for JobCore's `Engine`: in memory, no fetching. A job whose fetch URLs
// contain "/hang" stays running until cancelled; every other job succeeds at once,
// each fetch with the body {"ok":true}. Dropped at merge.
import Foundation
import JobCore

/// Stand-in: runs jobs (pretends to).
public final class Engine: @unchecked Sendable {
    private final class Waiter: Cancellable, @unchecked Sendable {
        let jobID: String
        let afterVersion: Int64?
        var callback: (@Sendable (JobRecord?) -> Void)?
        init(jobID: String, afterVersion: Int64?, callback: @escaping @Sendable (JobRecord?) -> Void) {
            self.jobID = jobID
            self.afterVersion = afterVersion
            self.callback = callback
        }
        weak var engine: Engine?
        func cancel() { engine?.removeWaiter(self) }
    }

    private let lock = NSLock()
    private let configuration: EngineConfiguration
    private var jobs: [String: JobRecord] = [:]
    private var order: [String] = []
    private var nodes: [String: [NodeRecord]] = [:]
    private var keys: [String: (id: String, request: JSONValue)] = [:]
    private var waiters: [Waiter] = []
    private var shuttingDown = false
    private var counter = 0

    public init(store: JobStore, fetcher: Fetcher, configuration: EngineConfiguration, logger: Logger) {
        self.configuration = configuration
    }

    public func start() throws {}

    public func submit(_ spec: JobSpec, request: JSONValue, idempotencyKey: String?) throws -> SubmitOutcome {
        lock.lock()
        defer { lock.unlock() }
        if shuttingDown { return .shuttingDown }
        if let key = idempotencyKey, let previous = keys[key], let job = jobs[previous.id] {
            return previous.request == request ? .existing(job) : .conflict(job)
        }
        if jobs.values.filter({ !$0.state.isSettled }).count >= configuration.maxActiveJobs { return .queueFull }
        counter += 1
        let now = Timestamp.nowMs()
        let id = String(format: "01STUB%020d", counter)
        let hangs = spec.graph.nodes.contains { $0.url?.contains("/hang") ?? false }
        var records: [NodeRecord] = []
        var progress = Progress()
        for (i, node) in spec.graph.nodes.enumerated() {
            var record = NodeRecord(jobID: id, id: node.id, parent: node.parent, position: i, type: node.type)
            let hangsHere = node.url?.contains("/hang") ?? false
            if hangs && (node.type != "fetch" || hangsHere) {
                record.state = .running
                record.startedAt = now
            } else {
                record.state = .succeeded
                record.startedAt = now
                record.finishedAt = now
                record.elapsedMs = 0
                if node.type == "fetch" {
                    record.attempts = 1
                    record.status = 200
                    record.result = .object(["status": 200, "body": .object(["ok": true]), "body_encoding": "json"])
                } else {
                    record.result = .array([])
                }
            }
            progress.move(from: nil, to: record.state)
            records.append(record)
        }
        var job = JobRecord(
            id: id, name: spec.name, state: records.first?.state ?? .succeeded, createdAt: now, startedAt: now,
            request: request, metadata: spec.metadata, deadlineMs: spec.deadlineMs, version: 2, progress: progress)
        if job.state.isSettled {
            job.finishedAt = now
            job.result = records.first?.result
        }
        jobs[id] = job
        nodes[id] = records
        order.append(id)
        if let key = idempotencyKey { keys[key] = (id, request) }
        return .created(job)
    }

    public func job(id: String) throws -> JobRecord? {
        lock.lock()
        defer { lock.unlock() }
        return jobs[id]
    }

    public func list(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage {
        lock.lock()
        defer { lock.unlock() }
        var start = order.count - 1
        if let cursor {
            guard cursor.hasPrefix("c"), let n = Int(cursor.dropFirst()), n >= 0, n < order.count else {
                throw StoreError(message: "invalid cursor")
            }
            start = n
        }
        var out: [JobRecord] = []
        var index = start
        while index >= 0 && out.count < limit {
            if let job = jobs[order[index]], state == nil || job.state == state { out.append(job) }
            index -= 1
        }
        return JobPage(jobs: out, nextCursor: index >= 0 ? "c\(index)" : nil)
    }

    public func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord]? {
        lock.lock()
        defer { lock.unlock() }
        guard let list = nodes[jobID] else { return nil }
        return includeResults ? list : list.map { var n = $0; n.result = nil; return n }
    }

    public func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        lock.lock()
        defer { lock.unlock() }
        return nodes[jobID]?.first { $0.id == nodeID }
    }

    public func body(jobID: String, nodeID: String) throws -> StoredBody? {
        lock.lock()
        defer { lock.unlock() }
        guard let node = nodes[jobID]?.first(where: { $0.id == nodeID }), node.type == "fetch", node.state == .succeeded
        else { return nil }
        return StoredBody(contentType: "application/json", bytes: Array("{\"ok\":true}".utf8))
    }

    public func cancel(id: String) throws -> CancelOutcome {
        lock.lock()
        guard var job = jobs[id] else {
            lock.unlock()
            return .notFound
        }
        switch job.state {
        case .cancelled:
            lock.unlock()
            return .alreadyCancelled(job)
        case .succeeded, .failed, .skipped:
            lock.unlock()
            return .alreadySettled(job)
        case .pending, .running:
            let now = Timestamp.nowMs()
            var records = nodes[id] ?? []
            for i in records.indices where !records[i].state.isSettled {
                job.progress.move(from: records[i].state, to: .cancelled)
                records[i].state = .cancelled
                records[i].finishedAt = now
                records[i].error = NodeError(.cancelled, "cancelled", node: records[i].id)
            }
            nodes[id] = records
            job.state = .cancelled
            job.finishedAt = now
            job.error = NodeError(.cancelled, "job cancelled", node: records.first?.id)
            job.version += 1
            jobs[id] = job
            let ready = takeWaiterCallbacks { $0.jobID == id }
            lock.unlock()
            ready.forEach { $0(job) }
            return .cancelling(job)
        }
    }

    public func delete(id: String) throws -> DeleteOutcome {
        lock.lock()
        defer { lock.unlock() }
        guard let job = jobs[id] else { return .notFound }
        if !job.state.isSettled { return .active(job) }
        jobs[id] = nil
        nodes[id] = nil
        order.removeAll { $0 == id }
        return .deleted
    }

    public func waitForChange(
        id: String, afterVersion: Int64?, timeoutMs: Int, _ callback: @escaping @Sendable (JobRecord?) -> Void
    ) -> Cancellable? {
        lock.lock()
        guard let job = jobs[id] else {
            lock.unlock()
            callback(nil)
            return nil
        }
        let ready = afterVersion.map { job.version > $0 } ?? job.state.isSettled
        if ready || shuttingDown {
            lock.unlock()
            callback(job)
            return nil
        }
        let waiter = Waiter(jobID: id, afterVersion: afterVersion, callback: callback)
        waiter.engine = self
        waiters.append(waiter)
        lock.unlock()
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(timeoutMs)) { [weak self, waiter] in
            guard let self else { return }
            self.lock.lock()
            let fire = waiter.callback
            waiter.callback = nil
            self.waiters.removeAll { $0 === waiter }
            let current = self.jobs[id]
            self.lock.unlock()
            fire?(current)
        }
        return waiter
    }

    public func beginShutdown() {
        lock.lock()
        shuttingDown = true
        let ready = takeWaiters { _ in true }
        let snapshot = jobs
        lock.unlock()
        for (jobID, fire) in ready { fire(snapshot[jobID]) }
    }

    public func shutdown(gracePeriodMs: Int) {}

    public var metrics: EngineMetrics {
        lock.lock()
        defer { lock.unlock() }
        var jobsByState: [NodeState: Int] = [:]
        var nodesByState: [NodeState: Int] = [:]
        for job in jobs.values {
            jobsByState[job.state, default: 0] += 1
            if !job.state.isSettled {
                for node in nodes[job.id] ?? [] { nodesByState[node.state, default: 0] += 1 }
            }
        }
        return EngineMetrics(
            jobsByState: jobsByState, nodesByState: nodesByState,
            activeJobs: jobs.values.filter { !$0.state.isSettled }.count, pendingFetches: 0, fetchesInFlight: 0)
    }

    private func removeWaiter(_ waiter: Waiter) {
        lock.lock()
        waiter.callback = nil
        waiters.removeAll { $0 === waiter }
        lock.unlock()
    }

    /// Must hold `lock`.
    private func takeWaiters(_ matching: (Waiter) -> Bool) -> [(String, @Sendable (JobRecord?) -> Void)] {
        var out: [(String, @Sendable (JobRecord?) -> Void)] = []
        waiters.removeAll { waiter in
            guard matching(waiter) else { return false }
            if let fire = waiter.callback { out.append((waiter.jobID, fire)) }
            waiter.callback = nil
            return true
        }
        return out
    }

    private func takeWaiterCallbacks(_ matching: (Waiter) -> Bool) -> [@Sendable (JobRecord?) -> Void] {
        let pairs = takeWaiters(matching)
        return pairs.map(\.1)
    }
}
