import Foundation

/// Runs jobs: turns each submitted graph into a tree of Deferreds, hands its
/// fetches to the shared `Fetcher` through one fair, bounded queue, records
/// every state change in the `JobStore`, and answers long-polls.
///
/// All mutable state belongs to one serial queue; public methods may be
/// called from any thread and never wait on the network.
public final class Engine: @unchecked Sendable {
    let store: JobStore
    let fetcher: Fetcher
    let configuration: EngineConfiguration
    let logger: Logger
    let queue = DispatchQueue(label: "jobserver.engine")
    let scheduler: DeferredScheduler

    // Owned by `queue`.
    private var runs: [String: JobRun] = [:]
    private var unsettledJobs = 0
    private var dirtyRuns: [ObjectIdentifier: JobRun] = [:]
    private var flushScheduled = false
    private var pumpScheduled = false
    private var fetchQueue: FetchQueue
    private var waiters: [String: [Waiter]] = [:]
    private var idGenerator = JobIDGenerator()
    private var shuttingDown = false
    private var sweepTimer: DispatchSourceTimer?
    private var retiring: [JobRun] = []
    private var retireScheduled = false
    /// Settled jobs change no more (but for deletion): the most recently read stay in memory.
    private let settledJobs = SettledJobCache(capacity: 1024)

    /// - Parameters:
    ///   - store: where jobs live.
    ///   - fetcher: runs the transfers.
    ///   - configuration: limits and bounds.
    ///   - logger: one line per job state change.
    public init(store: JobStore, fetcher: Fetcher, configuration: EngineConfiguration, logger: Logger) {
        self.store = store
        self.fetcher = fetcher
        self.configuration = configuration
        self.logger = logger
        self.scheduler = DispatchQueueScheduler(queue: queue)
        self.fetchQueue = FetchQueue(maxTotal: configuration.maxConcurrentFetches, maxPerHost: configuration.maxPerHost)
    }

    // MARK: - Start and stop

    /// Rebuilds the unfinished jobs found in the store and starts them (API.md §4), then starts the retention sweep.
    /// - Throws: `StoreError` when the store cannot be read.
    public func start() throws {
        let unfinished = try store.unfinishedJobs()
        var resumed = 0
        var refused: [JobRecord] = []
        queue.sync { () -> Void in
            for (job, nodes) in unfinished {
                if let run = rebuild(job, nodes) {
                    activate(run)
                    resumed += 1
                } else {
                    refused.append(job)
                }
            }
        }
        for var job in refused {
            job.state = .failed
            job.finishedAt = Timestamp.nowMs()
            job.error = NodeError(.internal, "the stored job could not be rebuilt", node: "root")
            job.version += 1
            store.enqueue(jobs: [job], nodes: [], bodies: [])
        }
        if resumed > 0 || !refused.isEmpty {
            logger.info("recovered jobs", ["resumed": .int(resumed), "failed": .int(refused.count)])
        }
        startSweeping()
    }

    private func rebuild(_ job: JobRecord, _ stored: [NodeRecord]) -> JobRun? {
        guard let spec = try? JobSpec.parse(job.request, limits: configuration.limits),
            spec.graph.nodes.count == stored.count
        else { return nil }
        var nodes = stored.sorted { $0.position < $1.position }
        var interrupted: Set<Int> = []
        var prior: [Int: Int] = [:]
        for i in nodes.indices where nodes[i].state == .running {
            if case .fetch(let request) = spec.graph.nodes[i].kind {
                prior[i] = nodes[i].attempts
                if !request.idempotent { interrupted.insert(i) }
            }
        }
        // Nodes that were running start again from pending; settled ones keep their results.
        var progress = Progress()
        for i in nodes.indices {
            if nodes[i].state == .running { nodes[i].state = .pending }
            progress.total += 1
            progress[nodes[i].state] += 1
        }
        var record = job
        record.progress = progress
        if nodes[0].state == .pending { record.state = .pending }
        let run = JobRun(engine: self, graph: spec.graph, record: record, nodes: nodes)
        run.interrupted = interrupted
        run.priorAttempts = prior
        return run
    }

    /// From now on submissions are refused, and every open long-poll is answered with the job as it is.
    public func beginShutdown() {
        queue.sync {
            shuttingDown = true
            for (id, list) in waiters {
                let job = runs[id]?.record
                for waiter in list { waiter.fire(job ?? (try? store.job(id: id)) ?? nil) }
            }
            waiters.removeAll()
        }
    }

    /// Stops every transfer without recording it as cancelled (so the jobs resume on the next start),
    /// writes all state and closes the store.
    /// - Parameter gracePeriodMs: how long the store may take to write what is queued.
    public func shutdown(gracePeriodMs: Int) {
        queue.sync {
            shuttingDown = true
            sweepTimer?.cancel()
            sweepTimer = nil
            flushDirty()
            for run in runs.values { run.stop() }
        }
        fetcher.shutdown()
        let done = DispatchSemaphore(value: 0)
        let store = self.store
        DispatchQueue.global().async {
            try? store.flush()
            done.signal()
        }
        if done.wait(timeout: .now() + .milliseconds(max(1, gracePeriodMs))) == .timedOut {
            logger.error("store did not finish writing within the grace period")
        }
        store.close()
    }

    // MARK: - Submitting

    /// Creates a job, durable when this returns, and starts it.
    /// - Parameters:
    ///   - spec: the validated submission.
    ///   - request: the submitted body, kept to rebuild the graph after a restart.
    ///   - idempotencyKey: the `Idempotency-Key` header, if any.
    /// - Throws: `StoreError` when the store fails.
    public func submit(_ spec: JobSpec, request: JSONValue, idempotencyKey: String?) throws -> SubmitOutcome {
        let (refusal, id): (SubmitOutcome?, String) = queue.sync {
            if shuttingDown { return (.shuttingDown, "") }
            if unsettledJobs >= configuration.maxActiveJobs { return (.queueFull, "") }
            return (nil, idGenerator.next(nowMs: Timestamp.nowMs()))
        }
        if let refusal { return refusal }
        let now = Timestamp.nowMs()
        var progress = Progress()
        progress.total = spec.graph.nodes.count
        progress.pending = spec.graph.nodes.count
        var job = JobRecord(
            id: id, name: spec.name, state: .pending, createdAt: now, request: request, metadata: spec.metadata,
            deadlineMs: spec.deadlineMs, version: 1, progress: progress)
        job.input = spec.input
        let nodes = spec.graph.nodes.map { node in
            NodeRecord(
                jobID: id, id: node.id, parent: node.parent.map { spec.graph.nodes[$0].id }, position: node.index,
                type: node.typeName)
        }
        let outcome = try store.createJob(
            job, nodes: nodes, idempotencyKey: idempotencyKey,
            requestHash: idempotencyKey == nil ? nil : fnv1aHex(request.bytes))
        switch outcome {
        case .created:
            logger.info("job created", ["job": .string(id), "nodes": .int(nodes.count)])
            let snapshot: JobRecord = queue.sync {
                let run = JobRun(engine: self, graph: spec.graph, record: job, nodes: nodes)
                activate(run)
                return run.record
            }
            return .created(snapshot)
        case .existing(let existing):
            return .existing(queue.sync { runs[existing.id]?.record } ?? existing)
        case .conflict(let existing):
            return .conflict(existing)
        }
    }

    private func activate(_ run: JobRun) {
        runs[run.id] = run
        if !run.record.state.isSettled { unsettledJobs += 1 }
        run.begin()
        schedulePump()
    }

    // MARK: - Reading

    /// The job, live while it runs.
    public func job(id: String) throws -> JobRecord? {
        if let live = queue.sync(execute: { runs[id]?.record }) { return live }
        return try storedJob(id: id)
    }

    /// A job no longer in memory: from the cache of settled jobs, else from the store.
    private func storedJob(id: String) throws -> JobRecord? {
        if let settled = settledJobs[id] { return settled }
        let job = try store.job(id: id)
        if let job, job.state.isSettled { settledJobs.insert(job) }
        return job
    }

    /// Jobs newest first, with live state for running ones.
    /// - Throws: `EngineError.badCursor` for a cursor this server did not hand out; `StoreError`.
    public func list(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage {
        try store.flush()
        var page: JobPage
        do {
            page = try store.listJobs(state: state, limit: limit, cursor: cursor)
        } catch let error as StoreError where error.kind == .badCursor {
            throw EngineError.badCursor(error.description)
        }
        queue.sync {
            for k in page.jobs.indices {
                if let live = runs[page.jobs[k].id]?.record, state == nil || live.state == state {
                    page.jobs[k] = live
                }
            }
        }
        return page
    }

    /// The job's nodes in tree order; `nil` when there is no such job.
    public func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord]? {
        let live: [NodeRecord]? = queue.sync {
            guard let run = runs[jobID] else { return nil }
            return includeResults ? run.nodes : run.nodes.map { var n = $0; n.result = nil; return n }
        }
        if let live { return live }
        guard try store.job(id: jobID) != nil else { return nil }
        return try store.nodes(jobID: jobID, includeResults: includeResults)
    }

    /// One node with its result.
    public func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        let live: NodeRecord?? = queue.sync {
            guard let run = runs[jobID] else { return nil }
            return .some(run.graph.index(ofNodeID: nodeID).map { run.nodes[$0] })
        }
        if let live { return live }
        return try store.node(jobID: jobID, nodeID: nodeID)
    }

    /// A fetch node's raw response body.
    public func body(jobID: String, nodeID: String) throws -> StoredBody? {
        try store.flush()
        return try store.body(jobID: jobID, nodeID: nodeID)
    }

    /// A snapshot of the counters for `/metrics`.
    public var metrics: EngineMetrics {
        var m = EngineMetrics()
        queue.sync {
            for run in runs.values {
                for state in NodeState.allCases { m.nodesByState[state, default: 0] += run.record.progress[state] }
            }
            m.activeJobs = unsettledJobs
            m.pendingFetches = fetchQueue.waiting
            m.fetchesInFlight = fetchQueue.inFlight
        }
        m.jobsByState = (try? store.jobCounts()) ?? [:]
        return m
    }

    // MARK: - Cancelling and deleting

    /// Cancels every unsettled node of the job.
    public func cancel(id: String) throws -> CancelOutcome {
        let live: CancelOutcome? = queue.sync {
            guard let run = runs[id] else { return nil }
            switch run.record.state {
            case .cancelled: return .alreadyCancelled(run.record)
            case .succeeded, .failed, .skipped: return .alreadySettled(run.record)
            case .pending, .running:
                run.cancel()
                flushDirty()
                return .cancelling(run.record)
            }
        }
        if let live { return live }
        guard let job = try store.job(id: id) else { return .notFound }
        switch job.state {
        case .cancelled: return .alreadyCancelled(job)
        case .pending, .running: return .cancelling(job)
        case .succeeded, .failed, .skipped: return .alreadySettled(job)
        }
    }

    /// Deletes a settled job with its nodes and bodies.
    public func delete(id: String) throws -> DeleteOutcome {
        let active: JobRecord? = queue.sync {
            guard let run = runs[id] else { return nil }
            if !run.record.state.isSettled { return run.record }
            // Settled, but children left running by `cancel_remaining: false`: stop them quietly.
            run.stop()
            forget(run)
            return nil
        }
        if let active { return .active(active) }
        settledJobs.remove(id)
        try store.flush()
        return try store.deleteJob(id: id) ? .deleted : .notFound
    }

    // MARK: - Long-polling

    /// Calls back once: as soon as the job's version exceeds `afterVersion` (without it: as soon as the job is
    /// settled), or after `timeoutMs` with the job as it is; with `nil` if there is no such job. Holds no thread
    /// while it waits.
    /// - Returns: a token to stop waiting (the client went away); `nil` when the callback already ran.
    public func waitForChange(
        id: String, afterVersion: Int64?, timeoutMs: Int, _ callback: @escaping @Sendable (JobRecord?) -> Void
    ) -> Cancellable? {
        let waiter = Waiter(afterVersion: afterVersion, callback: callback)
        enum Registration { case waiting, answered, notRunning(shuttingDown: Bool) }
        let registration: Registration = queue.sync {
            guard let run = runs[id] else { return .notRunning(shuttingDown: shuttingDown) }
            if waiter.isSatisfied(by: run.record) || shuttingDown || timeoutMs <= 0 {
                waiter.fire(run.record)
                return .answered
            }
            waiters[id, default: []].append(waiter)
            waiter.engine = self
            waiter.jobID = id
            return .waiting
        }
        switch registration {
        case .answered:
            return nil
        case .waiting:
            // Runs on the queue (scheduled with `queue.asyncAfter`).
            let timer = DispatchWorkItem { [weak self, waiter] in
                guard let self, !waiter.done else { return }
                self.dropWaiter(waiter, jobID: id)
                waiter.fire(self.runs[id]?.record ?? (try? self.storedJob(id: id)) ?? nil)
            }
            if waiter.arm(timer) { queue.asyncAfter(deadline: .now() + .milliseconds(timeoutMs), execute: timer) }
            return waiter
        case .notRunning(let shuttingDown):
            // Not running: a settled job changes no more, except by being deleted.
            guard let job = (try? storedJob(id: id)) ?? nil else {
                waiter.fire(nil)
                return nil
            }
            if waiter.isSatisfied(by: job) || timeoutMs <= 0 || shuttingDown {
                waiter.fire(job)
                return nil
            }
            let timer = DispatchWorkItem { [weak self, waiter] in
                waiter.fire((try? self?.storedJob(id: id)) ?? nil)
            }
            if waiter.arm(timer) {
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(timeoutMs), execute: timer)
            }
            return waiter
        }
    }

    /// Forgets a waiter that will not be answered through `notifyWaiters`; on the queue.
    private func dropWaiter(_ waiter: Waiter, jobID: String) {
        waiters[jobID]?.removeAll { $0 === waiter }
        if waiters[jobID]?.isEmpty == true { waiters[jobID] = nil }
    }

    fileprivate func removeWaiter(_ waiter: Waiter, jobID: String) {
        queue.async { self.dropWaiter(waiter, jobID: jobID) }
    }

    // MARK: - Called by runs, on the queue

    func enqueueFetch(run: JobRun, node: Int, host: String) {
        fetchQueue.enqueue(FetchQueue.Ticket(jobID: run.id, node: node), host: host)
        schedulePump()
    }

    func fetchFinished(host: String) {
        fetchQueue.finished(host: host)
        schedulePump()
    }

    private func schedulePump() {
        guard !pumpScheduled else { return }
        pumpScheduled = true
        queue.async { self.pumpFetches() }
    }

    private func pumpFetches() {
        pumpScheduled = false
        guard !shuttingDown else { return }
        while let (ticket, host) = fetchQueue.next() {
            if let run = runs[ticket.jobID], run.beginTransfer(ticket.node, host: host) { continue }
            fetchQueue.finished(host: host)  // no longer wanted: give the slot back
        }
    }

    func markDirty(_ run: JobRun) {
        dirtyRuns[ObjectIdentifier(run)] = run
        guard !flushScheduled else { return }
        flushScheduled = true
        queue.async { self.flushDirty() }
    }

    /// Hands the changes of this turn to the store in one batch and answers the long-polls they satisfy.
    private func flushDirty() {
        flushScheduled = false
        guard !dirtyRuns.isEmpty else { return }
        var jobs: [JobRecord] = []
        var nodes: [NodeRecord] = []
        var bodies: [(jobID: String, nodeID: String, body: StoredBody)] = []
        let batch = dirtyRuns.values
        dirtyRuns.removeAll()
        for run in batch {
            if run.dirtyJob { jobs.append(run.record) }
            for i in run.dirtyNodes.sorted() { nodes.append(run.nodes[i]) }
            bodies.append(contentsOf: run.pendingBodies)
            run.dirtyJob = false
            run.dirtyNodes.removeAll(keepingCapacity: true)
            run.pendingBodies.removeAll()
        }
        store.enqueue(jobs: jobs, nodes: nodes, bodies: bodies)
        for run in batch {
            notifyWaiters(run)
            if run.record.state.isSettled && run.unsettledNodes == 0 { retire(run) }
        }
    }

    private func notifyWaiters(_ run: JobRun) {
        guard let list = waiters[run.id] else { return }
        var remaining: [Waiter] = []
        for waiter in list {
            if waiter.isSatisfied(by: run.record) { waiter.fire(run.record) } else { remaining.append(waiter) }
        }
        waiters[run.id] = remaining.isEmpty ? nil : remaining
    }

    func jobStateChanged(_ run: JobRun) {
        logger.info("job state", ["job": .string(run.id), "state": .string(run.record.state.rawValue), "version": .int(run.record.version)])
        if run.record.state.isSettled { unsettledJobs -= 1 }
    }

    /// A finished job stays readable from memory until the store has committed its last state.
    /// Finished jobs wait here for the commit of their last state; one flush serves all of them.
    private func retire(_ run: JobRun) {
        guard runs[run.id] === run else { return }
        retiring.append(run)
        guard !retireScheduled else { return }
        retireScheduled = true
        let store = self.store
        DispatchQueue.global().async {
            // Taken before the flush: their last states were handed to the store before they got here.
            let batch: [JobRun] = self.queue.sync {
                defer { self.retiring.removeAll() }
                return self.retiring
            }
            try? store.flush()
            self.queue.async {
                for run in batch { self.forget(run) }
                self.retireScheduled = false
                if let next = self.retiring.popLast() { self.retire(next) }
            }
        }
    }

    private func forget(_ run: JobRun) {
        guard runs[run.id] === run else { return }
        runs[run.id] = nil
        if run.record.state.isSettled, !run.stopping { settledJobs.insert(run.record) }
        if !run.record.state.isSettled { unsettledJobs -= 1 }
        fetchQueue.removeJob(run.id)
    }

    // MARK: - Retention

    private func startSweeping() {
        guard configuration.retentionMs > 0 else { return }
        let timer = DispatchSource.makeTimerSource(queue: DispatchQueue.global(qos: .utility))
        let interval = max(1000, configuration.sweepIntervalMs)
        timer.schedule(deadline: .now() + .milliseconds(interval), repeating: .milliseconds(interval))
        timer.setEventHandler { [weak self] in self?.sweep() }
        queue.sync { sweepTimer = timer }
        timer.resume()
    }

    /// Deletes settled jobs older than the retention period; returns how many.
    @discardableResult
    public func sweep() -> Int {
        let cutoff = Timestamp.nowMs() - configuration.retentionMs
        do {
            let n = try store.sweep(finishedBeforeMs: cutoff)
            if n > 0 { settledJobs.removeAll() }
            if n > 0 { logger.info("retention sweep", ["deleted": .int(n)]) }
            return n
        } catch {
            logger.error("retention sweep failed", ["error": .string(String(describing: error))])
            return 0
        }
    }
}

/// One long-poll waiting for a job to change.
final class Waiter: Cancellable, @unchecked Sendable {
    let afterVersion: Int64?
    private let lock = NSLock()
    // Both guarded by `lock`; the timer's block holds the waiter, so it is let go once the waiter is done.
    private var callback: (@Sendable (JobRecord?) -> Void)?
    private var timer: DispatchWorkItem?
    weak var engine: Engine?
    var jobID = ""

    init(afterVersion: Int64?, callback: @escaping @Sendable (JobRecord?) -> Void) {
        self.afterVersion = afterVersion
        self.callback = callback
    }

    var done: Bool { lock.withLock { callback == nil } }

    func isSatisfied(by job: JobRecord) -> Bool {
        if let afterVersion { return job.version > afterVersion }
        return job.state.isSettled
    }

    /// Keeps `timer` to cancel it when the waiter is done; false (and nothing kept) if it is done already.
    func arm(_ timer: DispatchWorkItem) -> Bool {
        lock.withLock {
            guard callback != nil else { return false }
            self.timer = timer
            return true
        }
    }

    /// Answers once; later calls do nothing.
    func fire(_ job: JobRecord?) {
        finish()?(job)
    }

    /// Stops waiting without answering.
    func cancel() {
        _ = finish()
        engine?.removeWaiter(self, jobID: jobID)
    }

    /// Marks the waiter done and stops its timer; returns the callback if it had not run yet.
    private func finish() -> (@Sendable (JobRecord?) -> Void)? {
        let (cb, timer): ((@Sendable (JobRecord?) -> Void)?, DispatchWorkItem?) = lock.withLock {
            defer {
                callback = nil
                self.timer = nil
            }
            return (callback, self.timer)
        }
        timer?.cancel()
        return cb
    }
}

/// A bounded map of settled jobs by id, oldest entry evicted first. Thread-safe.
final class SettledJobCache: @unchecked Sendable {
    private let capacity: Int
    private let lock = NSLock()
    private var jobs: [String: JobRecord] = [:]
    private var order: [String] = []
    private var head = 0

    init(capacity: Int) { self.capacity = capacity }

    subscript(id: String) -> JobRecord? { lock.withLock { jobs[id] } }

    /// Keeps `job` without its submitted request, which reads never show.
    func insert(_ job: JobRecord) {
        var job = job
        job.request = .null
        lock.withLock {
            if jobs.updateValue(job, forKey: job.id) != nil { return }
            order.append(job.id)
            if order.count - head > capacity {
                jobs[order[head]] = nil
                head += 1
                if head > capacity {
                    order.removeFirst(head)
                    head = 0
                }
            }
        }
    }

    func remove(_ id: String) { lock.withLock { _ = jobs.removeValue(forKey: id) } }

    func removeAll() {
        lock.withLock {
            jobs.removeAll()
            order.removeAll()
            head = 0
        }
    }
}
