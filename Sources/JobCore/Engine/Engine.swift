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
    /// Stored jobs that could not be read or rebuilt at start (and were failed).
    private var jobLoadFailures = 0
    /// Settled jobs change no more (but for deletion): the most recently read stay in memory.
    private let settledJobs = SettledJobCache(capacity: 1024)
    /// Guards `deletions`, and every insertion into `settledJobs` of a job read from the store.
    private let cacheGate = NSLock()
    /// Counts committed deletions (and sweeps): a job read from the store before one of them may be gone
    /// by the time it would be cached, so it is cached only if no deletion committed meanwhile.
    private var deletions: UInt64 = 0

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

    /// Rebuilds the unfinished jobs found in the store and starts them (API.md §4), settles the nodes a crash
    /// left unsettled in settled jobs, then starts the retention sweep. A stored job that cannot be read or
    /// rebuilt fails alone, with kind `internal`.
    /// - Throws: `StoreError` when the store cannot be read at all.
    public func start() throws {
        var unreadable: [UnreadableJob] = []
        let unfinished = try store.unfinishedJobs(unreadable: &unreadable)
        var runs: [JobRun] = []
        var refused: [(job: JobRecord, reason: String)] = unreadable.map {
            ($0.job, "the stored job could not be read: \($0.error.description)")
        }
        for (job, nodes) in unfinished {
            do {
                runs.append(try rebuild(job, nodes))
            } catch {
                refused.append((job, "the stored job could not be rebuilt: \(error)"))
            }
        }
        var leftoverReasons: [String: String] = [:]
        if !refused.isEmpty {
            let now = Timestamp.nowMs()
            var failed: [JobRecord] = []
            for (job, reason) in refused {
                logger.error("stored job failed at start", ["job": .string(job.id), "reason": .string(reason)])
                var record = job
                record.state = .failed
                record.finishedAt = now
                record.result = nil
                record.error = NodeError(.internal, reason, node: "root")
                record.version += 1
                failed.append(record)
                leftoverReasons[job.id] = "the job failed when the server started: its stored form could not be loaded"
            }
            store.enqueue(jobs: failed, nodes: [], bodies: [])
            queue.sync { jobLoadFailures += refused.count }
        }
        // Before any job runs again: a job that settles from now on may rightly leave nodes running.
        settleLeftoverNodes(reasons: leftoverReasons)
        queue.sync {
            for run in runs { activate(run) }
        }
        if !runs.isEmpty || !refused.isEmpty {
            logger.info("recovered jobs", ["resumed": .int(runs.count), "failed": .int(refused.count)])
        }
        startSweeping()
    }

    /// Settles as `cancelled` the nodes left pending or running in settled jobs (a `cancel_remaining: false`
    /// list's children when the server stopped, or the nodes of a job failed at start), and counts them in
    /// their jobs' progress; waits for the commit.
    private func settleLeftoverNodes(reasons: [String: String]) {
        do {
            try store.flush()
            let leftovers = try store.unsettledNodesOfSettledJobs()
            guard !leftovers.isEmpty else { return }
            let now = Timestamp.nowMs()
            var jobs: [JobRecord] = []
            var nodes: [NodeRecord] = []
            var start = leftovers.startIndex
            while start < leftovers.endIndex {
                let jobID = leftovers[start].jobID
                let end = leftovers[start...].firstIndex { $0.jobID != jobID } ?? leftovers.endIndex
                var job: JobRecord?
                do {
                    job = try store.job(id: jobID)
                } catch {
                    logger.error("stored job could not be read to settle its nodes", ["job": .string(jobID), "error": .string("\(error)")])
                }
                let reason = reasons[jobID] ?? "the job had settled when the server stopped"
                for var node in leftovers[start..<end] {
                    job?.progress[node.state] -= 1
                    job?.progress[.cancelled] += 1
                    node.settleAsLeftover(reason: reason, nowMs: now)
                    nodes.append(node)
                }
                if var job {
                    job.version += 1
                    jobs.append(job)
                }
                start = end
            }
            store.enqueue(jobs: jobs, nodes: nodes, bodies: [])
            try store.flush()
            logger.info("settled nodes left unsettled in settled jobs", ["jobs": .int(jobs.count), "nodes": .int(nodes.count)])
        } catch {
            logger.error("nodes left unsettled in settled jobs could not be settled", ["error": .string("\(error)")])
        }
    }

    private func rebuild(_ job: JobRecord, _ stored: [NodeRecord]) throws -> JobRun {
        let spec = try JobSpec.parse(job.request, limits: configuration.limits)
        guard spec.graph.nodes.count == stored.count else {
            throw EngineError.invalidStoredJob("the graph has \(spec.graph.nodes.count) nodes, the store \(stored.count)")
        }
        var nodes = stored.sorted { $0.position < $1.position }
        // A node unsettled under a settled one will never be started again (a child a `cancel_remaining: false`
        // list left running, or a job whose last state was not written): it ends cancelled.
        let now = Timestamp.nowMs()
        var orphaned = Array(repeating: false, count: nodes.count)
        for i in nodes.indices where !nodes[i].state.isSettled {
            guard let parent = spec.graph.nodes[i].parent, orphaned[parent] || nodes[parent].state.isSettled else { continue }
            orphaned[i] = true
            nodes[i].settleAsLeftover(reason: "its parent had settled when the server stopped", nowMs: now)
        }
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
        // Settled here, so written with the job's first batch.
        for i in orphaned.indices where orphaned[i] { run.dirtyNodes.insert(i) }
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
        let job = JobRecord(
            id: id, name: spec.name, state: .pending, createdAt: now, request: request, metadata: spec.metadata,
            deadlineMs: spec.deadlineMs, version: 1, progress: progress)
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
        // A rebuilt run may have changed before it began (nodes settled as left over, a job that only missed
        // its last write): those changes go with the next batch.
        if run.dirtyJob || !run.dirtyNodes.isEmpty { markDirty(run) }
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
        let generation = cacheGate.withLock { deletions }
        let job = try store.job(id: id)
        if let job, job.state.isSettled {
            cacheGate.withLock { if deletions == generation { settledJobs.insert(job) } }
        }
        return job
    }

    /// Drops deleted jobs from the cache of settled jobs, after the store committed their deletion; a read
    /// that began before the commit can then not put them back.
    private func forgetDeleted(_ ids: [String]?) {
        cacheGate.withLock {
            deletions &+= 1
            if let ids {
                for id in ids { settledJobs.remove(id) }
            } else {
                settledJobs.removeAll()
            }
        }
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
            return run.nodeSnapshots(includeResults: includeResults)
        }
        if let live { return live }
        guard try store.job(id: jobID) != nil else { return nil }
        let stored = try store.nodes(jobID: jobID, includeResults: includeResults)
        // Every job has its root node: none means it was deleted between the two reads.
        return stored.isEmpty ? nil : stored
    }

    /// One node with its result.
    public func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        let live: NodeRecord?? = queue.sync {
            guard let run = runs[jobID] else { return nil }
            return .some(run.graph.index(ofNodeID: nodeID).map { run.nodeSnapshot($0) })
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
            m.jobLoadFailures = jobLoadFailures
        }
        m.jobsByState = (try? store.jobCounts()) ?? [:]
        return m
    }

    // MARK: - Cancelling and deleting

    /// Cancels every unsettled node of the job. `completion` runs once, on some other thread, when the
    /// store has committed the job's cancelled state and its nodes' (an answer promises they survive a crash),
    /// or with the error that kept them from being written. Never waits for the store.
    public func cancel(id: String, _ completion: @escaping @Sendable (Result<CancelOutcome, Error>) -> Void) {
        if let live = queue.sync(execute: { cancelLive(id) }) {
            answerAfterCommit(live, completion)
            return
        }
        do {
            guard let job = try store.job(id: id) else { return completion(.success(.notFound)) }
            switch job.state {
            case .cancelled: return completion(.success(.alreadyCancelled(job)))
            case .succeeded, .failed, .skipped: return completion(.success(.alreadySettled(job)))
            case .pending, .running: break
            }
            // Unfinished in the store yet not running here when we looked: it started, or finished and was
            // retired (which happens only once its last state is committed), between the two looks.
            if let live = queue.sync(execute: { cancelLive(id) }) { return answerAfterCommit(live, completion) }
            guard let again = try store.job(id: id) else { return completion(.success(.notFound)) }
            switch again.state {
            case .cancelled: completion(.success(.alreadyCancelled(again)))
            case .succeeded, .failed, .skipped: completion(.success(.alreadySettled(again)))
            case .pending, .running: completion(.failure(EngineError.storage("job \(id) is not running on this server")))
            }
        } catch {
            completion(.failure(error))
        }
    }

    /// Cancels the job if this engine runs it and hands its nodes' new states to the store; on the queue.
    /// `nil` when the job is not in memory.
    private func cancelLive(_ id: String) -> Result<CancelOutcome, Error>? {
        guard let run = runs[id] else { return nil }
        if shuttingDown || run.stopping { return .failure(EngineError.shuttingDown("the server is shutting down")) }
        switch run.record.state {
        case .cancelled: return .success(.alreadyCancelled(run.record))
        case .succeeded, .failed, .skipped: return .success(.alreadySettled(run.record))
        case .pending, .running:
            run.cancel()
            flushDirty()
            return .success(.cancelling(run.record))
        }
    }

    /// Passes `outcome` on once everything handed to the store so far is committed. An answer about a job in
    /// memory waits too: its state may still be on its way to the disk.
    private func answerAfterCommit(
        _ outcome: Result<CancelOutcome, Error>, _ completion: @escaping @Sendable (Result<CancelOutcome, Error>) -> Void
    ) {
        guard case .success(let answer) = outcome else { return completion(outcome) }
        store.flush { committed in
            // Off the store's writer thread, which commits the next batch meanwhile.
            DispatchQueue.global().async {
                switch committed {
                case .success: completion(.success(answer))
                case .failure(let error): completion(.failure(error))
                }
            }
        }
    }

    /// Deletes a settled job with its nodes and bodies; when this returns `.deleted`, the deletion is committed
    /// and no later read finds the job.
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
        try store.flush()
        let deleted = try store.deleteJob(id: id)
        forgetDeleted([id])
        return deleted ? .deleted : .notFound
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
            if n > 0 { forgetDeleted(nil) }
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
