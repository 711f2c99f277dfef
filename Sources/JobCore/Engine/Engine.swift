import Foundation
import Synchronization
import Threads

/// Runs jobs: turns each submitted graph into a tree of Deferreds, hands its
/// fetches to the shared `Fetcher` through one fair, bounded queue, records
/// every state change in the `JobStore`, and answers long-polls.
///
/// All mutable state belongs to one serial queue; public methods may be
/// called from any thread and never wait on the network.
public final class Engine: @unchecked Sendable {
    // @unchecked: the `var`s marked "Owned by `queue`" are touched only on `queue`; `notifyStatus` is set once,
    // before `start()`; the other stored properties are immutable references, and the objects they point to are
    // used only on `queue` (`eventHub`, `scheduler`) or guard themselves (`settledJobs`, `timekeeper`, `reads`).
    let store: JobStore
    let fetcher: Fetcher
    let configuration: EngineConfiguration
    let logger: Logger
    /// The response bytes all jobs in memory hold (`configuration.maxResponseMemory`), which every job's budget
    /// draws on; `nil`: no bound. It guards itself.
    let responseMemory: ByteBudget?
    let queue = DispatchQueue(label: "jobserver.engine")
    let scheduler: DeferredScheduler

    // Owned by `queue`.
    var runs: [String: JobRun] = [:]
    var unsettledJobs = 0 {
        didSet { activeJobCount.store(unsettledJobs, ordering: .relaxed) }
    }
    /// `unsettledJobs` as last set, readable from any thread: a submission is refused for it before its body is
    /// read (`refusesActiveJobs`).
    private let activeJobCount = Atomic<Int>(0)
    private var dirtyRuns: [ObjectIdentifier: JobRun] = [:]
    private var flushScheduled = false
    private var pumpScheduled = false
    /// Whether `pumpFetches` is running further up the stack (a coalesced fetch gives its slot back from inside it).
    private var pumping = false
    /// Fetches the fetcher's thread finished, not yet taken in on `queue` (`fetchEnded`).
    private let endedFetches = Locked<[EndedFetch]>([])
    /// Outcomes of ended fetches whose slots were given back (`pumpFetchesMidTurn`), in the order the fetches ended,
    /// until `takeInEndedFetches` takes them in; owned by `queue`.
    private var heldTakeIns: [@Sendable () -> Void] = []
    /// Coalesced transfers in flight (API.md §9); owned by `queue`.
    let sharedTransfers = SharedTransfers()
    /// The HTTP cache of `cache: "use"` fetches (API.md §9); set before `start()`, `nil`: such fetches go out as
    /// if `cache` were `off`.
    public var httpCache: HTTPCache?
    /// The request a `cache: "use"` fetch node gave, by `job id/node`, while a conditional one stands in for it.
    var cacheOriginals: [String: FetchRequest] = [:]
    /// The due time of the earliest pump timer armed for `--host-rate`.
    private var rateTimerDueNs: UInt64?
    /// The fetches waiting for a slot, and the slots taken; owned by `queue`.
    var fetchQueue: FetchQueue
    /// The bytes of the result texts the runs hold for their waiters' answers (`JobRun.answerTexts`), kept under
    /// `configuration.settledCacheBytes`; owned by `queue`.
    var answerTextBytes = 0
    /// The long-polls on jobs running here; their count is published in `longPollCount`.
    var waiters = WaiterTable() {
        didSet {
            guard waiters.count != publishedLongPolls else { return }
            publishedLongPolls = waiters.count
            longPollCount.withLock { [count = waiters.count] in $0 = count }
        }
    }
    private var publishedLongPolls = 0
    /// `waiters.count`, for `waitForLongPolls` on any thread.
    private let longPollCount = Watched(0)
    /// The event streams (`watchEvents`).
    let eventHub = JobEventHub()
    /// Makes the ids of new jobs; a submission takes one without a turn of `queue`.
    private let ids = Locked(JobIDGenerator())
    var shuttingDown = false {
        didSet { shutdownBegun.store(shuttingDown, ordering: .releasing) }
    }
    /// `shuttingDown` as last set, readable from any thread: a submission is refused for it without a turn of `queue`.
    private let shutdownBegun = Atomic<Bool>(false)
    private var sweepTimer: DispatchSourceTimer?
    private var retiring: [JobRun] = []
    /// The finished runs whose last commit is waited for (while `retireScheduled`): held here, not by the wait's
    /// callbacks, so that none of those is left holding them on the thread that drops it last.
    private var awaitingCommit: [JobRun] = []
    private var retireScheduled = false
    /// Where runs that left memory are let go of (`letGo`; tests suspend it).
    let releaseQueue = DispatchQueue(label: "jobserver.run-release", qos: .utility)
    // Owned by `queue`: what `/metrics` shows, kept as the engine goes so that a scrape reads no store.
    /// Every stored job by state: from the store at start, then moved at each state change, delete and sweep.
    var jobsByState: [NodeState: Int] = [:]
    /// The nodes of the runs in memory by state.
    private var nodesByState: [NodeState: Int] = [:]
    /// The state each run's job is counted in, by job id.
    private var countedJobState: [String: NodeState] = [:]

    /// Settled jobs change no more (but for deletion): their answers, made once, stay in memory up to a byte bound.
    let settledJobs: SettledJobCache
    /// Reads of jobs from the store under way, by id, each with the reads that joined it (`readStored`).
    let storedReads = JoinedReads<JobRead>()
    /// Reads of stored jobs' node lists with results under way, joined like `storedReads`.
    let storedNodeLists = JoinedReads<NodeListRead>()
    /// Answers made from the store for jobs of `configuration.largeReadNodes` nodes or more, one at a time: each
    /// holds its job's rows while it is written (63 MiB for a job of 100,000 fetches, 153 MiB for its node list),
    /// so readers of different large jobs at once would hold all of theirs. The others wait their turn without a
    /// thread (`whenLargeReadsAllow`).
    let largeReads = Admission(limit: 1)
    /// How the answers the engine keeps or shares are written.
    private let rendering: AnswerRendering
    /// Gives back to the system what large runs and large reads from the store free.
    let memoryReturn = MemoryReturn()
    /// Store reads and the answers made from them run here, never on a caller's (event-loop) thread nor on `queue`.
    let reads = ReadPool(queues: 8)
    /// The read pool's queues (tests hold them to play a slow store).
    var readQueues: [DispatchQueue] { reads.queues }
    /// Stored jobs that could not be read or rebuilt at start (and were failed).
    private var jobLoadFailures = 0
    /// Owned by `queue`: the running and waiting jobs of each concurrency key (API.md §8).
    var gate = ConcurrencyGate()
    /// Owned by `queue`: fetch results share their `headers` objects where they agree.
    let headerObjects = HeaderObjects()
    /// Jobs waiting in the store for their `not_before`, and the one timer for the earliest (API.md §8).
    let timekeeper = Timekeeper()
    /// The nodes of the jobs in memory, against `configuration.maxActiveNodes`; jobs over it wait in the store.
    let nodeRoom: NodeRoom
    /// A stored job's webhook delivery state (`notify`), looked up on a read queue when the job is read from the
    /// store. Set once, before `start()`.
    public var notifyStatus: (@Sendable (String) -> NotifyStatus?)?
    /// The store when several servers share it (PostgreSQL, API.md §10); `nil` on SQLite.
    let shared: SharedJobStore?
    /// Long-polls and event streams on jobs other servers run.
    let remoteWaits = RemoteWaits()
    let remoteStreams = RemoteStreams()
    /// Owned by `queue`: the poll behind `remoteWaits`.
    var remotePollTimer: DispatchSourceTimer?

    /// - Parameters:
    ///   - store: where jobs live.
    ///   - fetcher: runs the transfers.
    ///   - configuration: limits and bounds.
    ///   - logger: one line per job state change.
    ///   - rendering: how settled jobs' answers and node lists are written (`AnswerRendering`); by default none is
    ///     kept or shared.
    public init(
        store: JobStore, fetcher: Fetcher, configuration: EngineConfiguration, logger: Logger,
        rendering: AnswerRendering = AnswerRendering()
    ) {
        self.store = store
        self.fetcher = fetcher
        self.configuration = configuration
        nodeRoom = NodeRoom(budget: configuration.maxActiveNodes)
        if configuration.maxActiveNodes > 0 { memoryReturn.roomTrimNodes = configuration.maxActiveNodes / 4 }
        self.logger = logger
        self.rendering = rendering
        self.settledJobs = SettledJobCache(capacityBytes: configuration.settledCacheBytes)
        self.responseMemory =
            configuration.maxResponseMemory > 0 ? ByteBudget(limit: configuration.maxResponseMemory, scope: .server) : nil
        self.scheduler = DispatchQueueScheduler(queue: queue)
        self.shared = store as? SharedJobStore
        // Holding fetches beyond a host's slots is left to the fetcher only where its own limit is as tight, and
        // not when servers share the slots (each is taken in the store before the fetch is handed over).
        let fetcherHolds = fetcher.plainHTTPTransfersPerHost.map { $0 <= configuration.maxPerHost } ?? false
        self.fetchQueue = FetchQueue(
            maxTotal: configuration.maxConcurrentFetches, maxPerHost: configuration.maxPerHost,
            heldInFetcher: fetcherHolds && shared == nil ? configuration.maxPerHost : 0)
        timekeeper.engine = self
        self.fetchQueue.rateLimiter = HostRateLimiter(configuration.hostRates)
        self.fetchQueue.rateLimiter.booksInStore = store is SharedHostRates
        shared?.attach(self)
    }

    // MARK: - Start and stop

    /// Rebuilds the unfinished jobs found in the store and starts them (API.md §4), settles the nodes a crash
    /// left unsettled in settled jobs, then starts the retention sweep. A stored job that cannot be read or
    /// rebuilt fails alone, with kind `internal`.
    /// - Throws: `StoreError` when the store cannot be read at all.
    public func start() throws {
        var unreadable: [UnreadableJob] = []
        let unfinished = try store.unfinishedJobs(unreadable: &unreadable)
        var runs: [(run: JobRun, storedState: NodeState)] = []
        var refused: [(job: JobRecord, reason: String)] = unreadable.map {
            ($0.job, "the stored job could not be read: \($0.error.description)")
        }
        for (job, nodes) in unfinished {
            do {
                runs.append((try rebuild(job, nodes), job.state))
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
                failed.append(job.failedWhenLoaded(reason, at: now))
                leftoverReasons[job.id] = "the job failed when the server started: its stored form could not be loaded"
            }
            store.enqueue(jobs: failed, nodes: [], bodies: [])
            queue.sync { jobLoadFailures += refused.count }
        }
        // Before any job runs again: a job that settles from now on may rightly leave nodes running.
        settleLeftoverNodes(reasons: leftoverReasons)
        // Read once the failed jobs are written: /metrics moves these counts as jobs change from now on.
        let counts = try store.jobCounts()
        queue.sync {
            jobsByState = counts
            // Jobs that were running hold their concurrency keys' slots before any waiting job is let in.
            for (run, storedState) in runs where storedState == .running {
                // `activate` counts the job again in the state it resumes in.
                jobsByState[storedState, default: 0] -= 1
                activate(run, resumed: true)
            }
            for (run, storedState) in runs where storedState != .running {
                jobsByState[storedState, default: 0] -= 1
                activate(run)
            }
        }
        if !runs.isEmpty || !refused.isEmpty {
            logger.info("recovered jobs", ["resumed": .int(runs.count), "failed": .int(refused.count)])
        }
        startSweeping()
        try timekeeper.start()
        startSharing()
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

    func rebuild(_ job: JobRecord, _ stored: [NodeRecord]) throws -> JobRun {
        var spec = try JobSpec.parse(job.request, limits: configuration.limits.forStoredJobs)
        // The copies of the maps that had expanded come after the submitted nodes, as they were made: made again from
        // the items stored for each, whether or not any copy's row is stored yet (on SQLite a copy's row waits for its
        // first change).
        if spec.graph.hasMaps {
            try MapExpansion.restore(store.mapExpansions(jobID: job.id), into: &spec.graph)
        }
        // A node's row may be missing: stopped between the job's commit and its node rows' (`createJob`), or a row
        // that is stored only with its node's first change (`PendingChanges.unchanged`). Either way no change of the
        // node was stored, so it starts from the beginning, as a node whose start was not yet committed does. A job
        // changed since its creation has the row of its root at least (its first change is the root's start, written
        // in the same commit): one with no row at all is damaged, and fails below.
        guard !stored.isEmpty || job.version == 1 else {
            throw EngineError.invalidStoredJob("the job changed since it was created, but none of its node rows is stored")
        }
        var nodes = spec.graph.pendingNodeRecords(jobID: job.id)
        var found = Array(repeating: false, count: nodes.count)
        for node in stored {
            guard nodes.indices.contains(node.position), !found[node.position] else {
                throw EngineError.invalidStoredJob("the graph has \(nodes.count) nodes, the store one at position \(node.position)")
            }
            found[node.position] = true
            nodes[node.position] = node
        }
        let missing = found.indices.filter { !found[$0] }.map { nodes[$0] }
        if !missing.isEmpty {
            store.enqueue(unstoredNodes: missing)
            logger.info("stored job lacked node rows; they are made again from its request, pending", [
                "job": .string(job.id), "nodes": .int(missing.count),
            ])
        }
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
            for (id, list) in waiters.takeAll() {
                let job = runs[id]?.record
                for waiter in list { waiter.fire(job ?? (try? store.job(id: id)) ?? nil) }
            }
            answerRemoteWaiters()
            eventHub.endAll { runs[$0]?.record }
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
            timekeeper.stop()
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

    /// Whether a job that does not wait for a time would be refused now for `maxActiveJobs` (`.queueFull`), read
    /// without the engine's queue: under a flood, the refusal then costs no parse of the body it refuses.
    public var refusesActiveJobs: Bool {
        activeJobCount.load(ordering: .relaxed) >= configuration.maxActiveJobs
    }

    /// Creates a job and starts it; `completion` runs once the job is durable and taken in, or refused: on a shared
    /// queue, or at once on the calling thread for a refusal that needs no store (shutting down, too many jobs).
    /// Nothing here waits: the store's commit answers through a callback, and the job is taken in by a turn of the
    /// engine's queue.
    /// - Parameters:
    ///   - spec: the validated submission.
    ///   - request: the submitted body, kept to rebuild the graph after a restart.
    ///   - idempotencyKey: the `Idempotency-Key` header, if any.
    ///   - requestBytes: the body exactly as it came: with an idempotency key, a later submission is the
    ///     same request only if its bytes are the same (API.md), not merely the same JSON. Without it,
    ///     the compact serialisation of `request` stands for them.
    ///   - completion: the outcome, or a `StoreError` when the store fails; then nothing of the job is stored or
    ///     running (`isResourceFailure`: the disk is full or failing, and the submission may be retried later).
    public func submit(
        _ spec: JobSpec, request: JSONValue, idempotencyKey: String?, requestBytes: [UInt8]? = nil,
        _ completion: @escaping @Sendable (Result<SubmitOutcome, Error>) -> Void
    ) {
        let now = Timestamp.nowMs()
        // A job that waits for its time waits in the store, not among the active jobs.
        var dueAt = spec.schedule.notBefore.flatMap { $0 > now ? $0 : nil }
        // Read from their mirrors: a submission waits for `queue` only to start its job, not behind every fetch
        // outcome queued there to learn whether it may. The limits were never exact under concurrent submissions
        // (the check and the start are two turns apart either way).
        if shutdownBegun.load(ordering: .acquiring) { return completion(.success(.shuttingDown)) }
        if dueAt == nil, refusesActiveJobs { return completion(.success(.queueFull)) }
        // A job that would take the nodes in memory over `maxActiveNodes` waits in the store for room, due now.
        let reserved = dueAt == nil && nodeRoom.take(forNew: spec.graph.nodes.count) ? spec.graph.nodes.count : 0
        let waitsForRoom = dueAt == nil && reserved == 0
        if waitsForRoom { dueAt = now }
        let id = ids.withLock { $0.next(nowMs: Timestamp.nowMs()) }
        var progress = Progress()
        progress.total = spec.graph.nodes.count
        progress.pending = spec.graph.nodes.count
        var job = JobRecord(
            id: id, name: spec.name, state: .pending, createdAt: now, request: request, metadata: spec.metadata,
            deadlineMs: spec.deadlineMs, version: 1, progress: progress)
        job.input = spec.input
        job.notBefore = spec.schedule.notBefore
        job.dueAt = dueAt
        job.concurrencyKey = spec.schedule.concurrencyKey
        job.concurrencyLimit = spec.schedule.concurrencyLimit
        let created = job
        let requestHash = idempotencyKey == nil ? nil : fnv1aHex(requestBytes ?? request.bytes)
        let nodes = spec.graph.pendingNodeRecords(jobID: id)
        let waits = dueAt
        if waits == nil, idempotencyKey == nil, startsBeforeCommit(spec) {
            // Queued before the create, so that its commit's answer finds the run.
            queue.async { [self] in
                let run = JobRun(engine: self, graph: spec.graph, record: created, nodes: nodes)
                run.roomHeld = reserved
                run.provisional = true
                activate(run)
            }
            store.createJob(
                created, nodes: nodes, idempotencyKey: nil, requestHash: nil, nodesMayFollow: true
            ) { [self] result in
                queue.async { [self] in confirmStart(of: id, result, completion) }
            }
            return
        }
        let create: @Sendable () -> Void = { [self] in
            store.createJob(
                created, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash,
                // A job that waits for its time is read from the store until then; one that starts now, from memory.
                nodesMayFollow: waits == nil
            ) { [self] result in
                // Committed or refused, the row is where the timekeeper's next read finds it, or never will be.
                defer { if waitsForRoom { nodeRoom.arrived() } }
                if case .success(.created) = result {} else { giveBack(reserved) }
                switch result {
                case .success(.created):
                    takeIn(created, spec.graph, nodes, reserved: reserved, completion)
                case .success(.existing(let existing)):
                    queue.async { [self] in
                        let shown = runs[existing.id].map(shownRecord) ?? existing
                        Self.answer(completion) { .success(.existing(shown)) }
                    }
                case .success(.conflict(let existing)):
                    Self.answer(completion) { .success(.conflict(existing)) }
                case .failure(let error):
                    Self.answer(completion) { .failure(error) }
                }
            }
        }
        if waits == nil {
            create()
        } else {
            // The timekeeper's count is the queue's.
            queue.async { [self] in
                if timekeeper.scheduledJobs >= configuration.maxScheduledJobs {
                    if waitsForRoom { nodeRoom.arrived() }
                    return completion(.success(.queueFull))
                }
                create()
            }
        }
    }

    /// A synchronous `submit`, for callers that may block (tests and tools); the server never calls it.
    /// - Throws: the `StoreError` the asynchronous `submit` answers with.
    public func submit(
        _ spec: JobSpec, request: JSONValue, idempotencyKey: String?, requestBytes: [UInt8]? = nil
    ) throws -> SubmitOutcome {
        try waitForCompletion { done in
            submit(spec, request: request, idempotencyKey: idempotencyKey, requestBytes: requestBytes, done)
        }.get()
    }

    /// Whether a submission that starts now may start before its creation commits: its fetches then run while the
    /// store writes its row (for a job of 100,000 fetches, its 9 MB request), and its answer still waits for the
    /// commit. Only for a job of `configuration.startBeforeCommitNodes` nodes or more, on one server, without a
    /// concurrency key (whose slot is the store's to give) or maps (whose items are written as they expand), and
    /// whose every fetch is a `GET` or `HEAD` that neither joins another's transfer nor uses the response cache:
    /// should the commit fail, the job is dropped, and it must have done nothing but read.
    func startsBeforeCommit(_ spec: JobSpec) -> Bool {
        guard shared == nil, spec.schedule.concurrencyKey == nil,
            spec.graph.nodes.count >= configuration.startBeforeCommitNodes
        else { return false }
        return spec.graph.nodes.allSatisfy { node in
            switch node.kind {
            case .fetch(let request):
                return (request.method == "GET" || request.method == "HEAD") && !request.coalesce
                    && request.cache == .off
            case .list, .sequence: return true
            case .map: return false
            }
        }
    }

    /// Answers a submission whose run started before its creation committed (`startsBeforeCommit`), now that the
    /// store answered: committed, the run hands the store what it changed meanwhile; refused, it is dropped
    /// without a trace, and the submission fails. On the queue, after the turn that activated the run.
    private func confirmStart(
        of id: String, _ result: Result<CreateOutcome, StoreError>,
        _ completion: @escaping @Sendable (Result<SubmitOutcome, Error>) -> Void
    ) {
        guard let run = runs[id], run.provisional else {
            // Not reached: nothing takes a provisional run out of `runs` but this.
            return Self.answer(completion) { .failure(EngineError.storage("job \(id) was lost before its creation committed")) }
        }
        guard case .success(.created) = result else {
            run.stop()
            if let counted = countedJobState[id] { jobsByState[counted, default: 0] -= 1 }
            forget(run)
            return Self.answer(completion) {
                switch result {
                case .failure(let error): return .failure(error)
                // Without an idempotency key the store answers nothing but `.created`.
                case .success(let outcome):
                    return .failure(EngineError.storage("job \(id): the store answered \(outcome) to its creation"))
                }
            }
        }
        run.provisional = false
        if !run.stopping, run.hasUnwrittenChanges { markDirty(run) }
        answerCreated(shownRecord(run), nodes: run.nodes.count, completion)
    }

    /// Answers a submission whose job is created.
    private func answerCreated(
        _ shown: JobRecord, nodes: Int, _ completion: @escaping @Sendable (Result<SubmitOutcome, Error>) -> Void
    ) {
        Self.answer(completion) { [self] in
            logger.info("job created", ["job": .string(shown.id), "nodes": .int(nodes)])
            return .success(.created(shown))
        }
    }

    /// Takes in a job whose creation just committed (on the store's thread): one that waits for its time is counted
    /// among the scheduled, one that starts now is activated, each in a turn of `queue`. With a concurrency key
    /// shared through the store, its admission asks the store first, off both threads.
    private func takeIn(
        _ job: JobRecord, _ graph: JobGraph, _ nodes: [NodeRecord], reserved: Int,
        _ completion: @escaping @Sendable (Result<SubmitOutcome, Error>) -> Void
    ) {
        let created: @Sendable (JobRecord) -> Void = { [self] shown in answerCreated(shown, nodes: nodes.count, completion) }
        if let dueAt = job.dueAt {
            queue.async { [self] in
                timekeeper.scheduledJobs += 1
                jobsByState[.pending, default: 0] += 1
                timekeeper.scheduled(dueAt: dueAt)
                created(job)
            }
            return
        }
        let start: @Sendable ((holders: [String], waiting: [String])?) -> Void = { [self] pass in
            queue.async { [self] in
                let run = JobRun(engine: self, graph: graph, record: job, nodes: nodes)
                run.roomHeld = reserved
                activate(run, hold: pass != nil)
                if let pass { waitAfterSubmission(run, pass) }
                created(shownRecord(run))
            }
        }
        if job.concurrencyKey != nil, keyAdmission != nil {
            DispatchQueue.global().async { [self] in start(admitSubmitted(job)) }
        } else {
            start(nil)
        }
    }

    /// Calls `completion` with what `outcome` makes on a shared queue: a submission's answer (its log line, the
    /// caller's response) is no work for the store's writer or the engine's queue, which every job waits on. With the
    /// answer built on the engine's queue, 60 s `wrk` runs posting 10-fetch jobs gave 5–12 % fewer jobs per second
    /// than the blocking submission before it; with the hop, as many or more.
    private static func answer(
        _ completion: @escaping @Sendable (Result<SubmitOutcome, Error>) -> Void,
        _ outcome: @escaping @Sendable () -> Result<SubmitOutcome, Error>
    ) {
        DispatchQueue.global().async { completion(outcome()) }
    }

    /// How the store's writes are going (`/healthz`, `/metrics`).
    public var storeHealth: StoreHealth { store.health }

    /// Takes a run in and begins it, or keeps it waiting for its concurrency key (`resumed`: it was running when
    /// the server stopped, and takes a slot at once) or, with `hold`, does not begin it at all (it is about to be
    /// cancelled).
    func activate(_ run: JobRun, resumed: Bool = false, hold: Bool = false) {
        runs[run.id] = run
        if run.roomHeld == 0 {
            run.roomHeld = run.nodes.count
            nodeRoom.take(run.roomHeld)
        }
        if !run.record.state.isSettled { unsettledJobs += 1 }
        countedJobState[run.id] = run.record.state
        jobsByState[run.record.state, default: 0] += 1
        for state in NodeState.allCases { nodesByState[state, default: 0] += run.record.progress[state] }
        if !hold { admit(run, resumed: resumed) }
        // A rebuilt run may have changed before it began (nodes settled as left over, a job that only missed
        // its last write): those changes go with the next batch.
        if run.hasUnwrittenChanges { markDirty(run) }
        schedulePump()
    }

    // MARK: - Reading
    //
    // Reads take a completion and never wait on the caller's thread: a settled job's cached answer is handed over at
    // once, anything else is looked up on `queue` (with `async`) and in the store on a read queue. Completions run
    // on a read queue (or, for a cache hit, on the caller's thread), so they may build large answers there.

    /// Runs `work` on the read queue with the least work waiting.
    func onReadQueue(_ work: @escaping @Sendable () -> Void) {
        reads.async(work)
    }

    /// Runs `read` on a read queue once the store has committed everything handed to it before this call, and passes
    /// on what it returns or throws, or the commit's failure. Holds no thread while it waits.
    func readAfterCommit<T>(
        _ read: @escaping @Sendable () throws -> T, _ completion: @escaping @Sendable (Result<T, Error>) -> Void
    ) {
        store.flush { [self] flushed in
            // On the writer's thread: only hand over.
            onReadQueue {
                completion(Result {
                    try flushed.get()
                    return try read()
                })
            }
        }
    }

    /// The job as `GET /v1/jobs/{id}` shows it: a settled job's answer made once (from the cache without touching
    /// `queue`), else the live record, else the stored one (read without its submitted request).
    /// - Parameter known: whether the reader already has the job at this version (a conditional request's
    ///   `If-None-Match`): then a job not in memory is answered `.unchanged` from its version alone, and a settled
    ///   job of many results is not read and shown only to be dropped.
    public func readJob(
        id: String, known: (@Sendable (Int64) -> Bool)? = nil, _ completion: @escaping @Sendable (Result<JobRead, Error>) -> Void
    ) {
        if let settled = settledJobs[id] {
            let isKnown = known?(settled.version) ?? false
            completion(.success(isKnown ? .unchanged(version: settled.version) : .settled(settled)))
            return
        }
        read(id, live: { .record(self.shownRecord($0)) }, storedThen: { answer in
            do {
                if let known, let version = try self.store.jobVersion(id: id), known(version) {
                    return answer(.success(.unchanged(version: version)))
                }
            } catch {
                return answer(.failure(error))
            }
            self.readStored(id, answer)
        }) { read in
            completion(self.withStorePosition(read))
        }
    }

    /// A job no longer in memory: its answer from the cache (made meanwhile, perhaps), else from the store, once for
    /// all who ask for it meanwhile: a read that finds another under way joins it rather than reading, assembling
    /// and showing a settled job of many results again. On a read queue; the joined reads are answered on the
    /// thread of the one they joined.
    private func readStored(_ id: String, _ completion: @escaping @Sendable (Result<JobRead, Error>) -> Void) {
        if let settled = settledJobs[id] { return completion(.success(.settled(settled))) }
        whenLargeReadsAllow(id) {
            // A reader that waited may find the answer the one before it made, still held by its readers.
            if let settled = self.settledJobs[id] { return completion(.success(.settled(settled))) }
            self.storedReads.read(id, completion) { try self.readStoredJob(id: id) }
        }
    }

    /// Runs `read` now, or, for a job of `configuration.largeReadNodes` nodes or more, once the large reads before
    /// it are done (`largeReads`), on a read queue. On a read queue.
    private func whenLargeReadsAllow(_ jobID: String, _ read: @escaping @Sendable () -> Void) {
        guard let nodes = (try? store.nodeCount(id: jobID)) ?? nil, nodes >= configuration.largeReadNodes else {
            return read()
        }
        largeReads.enter { release in
            self.onReadQueue {
                read()
                // The next large read, on another read thread, would grow that thread's arena beside this one's,
                // which keeps what this read freed: four readers of four 100,000-fetch jobs' node lists peaked at
                // 271 MiB so, against 189 for one.
                if self.largeReads.counts.waiting > 0 { self.memoryReturn.trimNow() }
                release()
            }
        }
    }

    /// Answers from the run in memory (looked at on `queue`), else from `stored` (on a read queue).
    private func read<Answer: Sendable>(
        _ jobID: String, live: @escaping @Sendable (JobRun) -> Answer, stored: @escaping @Sendable () throws -> Answer,
        _ completion: @escaping @Sendable (Result<Answer, Error>) -> Void
    ) {
        read(jobID, live: live, storedThen: { answer in answer(Result(catching: stored)) }, completion)
    }

    /// `read` with a store read that answers through a completion, when it may hand the answer over later.
    private func read<Answer: Sendable>(
        _ jobID: String, live: @escaping @Sendable (JobRun) -> Answer,
        storedThen stored: @escaping @Sendable (@escaping @Sendable (Result<Answer, Error>) -> Void) -> Void,
        _ completion: @escaping @Sendable (Result<Answer, Error>) -> Void
    ) {
        queue.async {
            let found = self.visibleRun(jobID).map(live)
            self.onReadQueue {
                if let found {
                    completion(.success(found))
                } else {
                    stored(completion)
                }
            }
        }
    }

    /// A job no longer in memory, from the store; a settled one's answer is made and kept. On a read queue.
    private func readStoredJob(id: String) throws -> JobRead {
        // Taken before the read: a delete meanwhile must not be undone by keeping what was read before it.
        let removals = settledJobs.removals
        let found: StoredJobShown<SettledAnswer>
        if rendering.settled != nil, let settledWithResultText = rendering.settledWithResultText {
            found = try store.showStoredJob(id: id) { job, result in
                var job = job
                job.notify = notifyStatus?(id)
                return try settledWithResultText(job, result)
            }
        } else {
            found = try store.jobWithoutRequest(id: id).map(StoredJobShown.record) ?? .notFound
        }
        let settled: SettledJob
        switch found {
        case .notFound:
            return .notFound
        case .shown(let job, let answer):
            settled = SettledJob(id: id, version: job.version, answer: answer)
        case .record(var job):
            job.notify = notifyStatus?(id)
            guard job.state.isSettled, let render = rendering.settled else { return .record(job) }
            settled = SettledJob(id: id, version: job.version, body: render(job))
        }
        settledJobs.insert(settled, ifNoRemovalSince: removals)
        // What the read held (the rows, or the results as values) is let go of on return.
        memoryReturn.answerMade(bytes: settled.answer.count)
        return .settled(settled)
    }

    /// A job no longer in memory, as a record, without its submitted request.
    func storedJob(id: String) throws -> JobRecord? {
        guard var job = try store.jobWithoutRequest(id: id) else { return nil }
        job.notify = notifyStatus?(id)
        return withStorePosition(job)
    }

    /// Drops deleted jobs from the cache of settled jobs, after the store committed their deletion: a read
    /// that began before the commit counted the cache's removals and so cannot put them back.
    private func forgetDeleted(_ ids: [String]?) {
        if let ids {
            for id in ids { settledJobs.remove(id) }
        } else {
            settledJobs.removeAll()
        }
    }

    /// The job's nodes in tree order; `nil` when there is no such job.
    public func nodes(
        jobID: String, includeResults: Bool, _ completion: @escaping @Sendable (Result<[NodeRecord]?, Error>) -> Void
    ) {
        read(
            jobID, live: { run -> [NodeRecord]? in run.nodeSnapshots(includeResults: includeResults) },
            stored: { try self.store.stateAndNodes(jobID: jobID, includeResults: includeResults)?.nodes }) { result in
                // On a read queue: a map's copies, stored after the submitted nodes, are put in tree order here.
                completion(result.map { $0?.inTreeOrder() })
            }
    }

    /// The job's nodes in tree order, as `GET /v1/jobs/{id}/nodes` shows them. A settled job's nodes with their
    /// results (twice the job's answer, or more: a parent's result holds its children's) are shown once for the
    /// reads under way and shared while any reader holds them, as a large settled answer is.
    public func nodeList(
        jobID: String, includeResults: Bool, _ completion: @escaping @Sendable (Result<NodeListRead, Error>) -> Void
    ) {
        guard includeResults, let renderNodeList = rendering.nodeList else {
            return nodes(jobID: jobID, includeResults: includeResults) { read in
                completion(read.map { $0.map(NodeListRead.nodes) ?? .notFound })
            }
        }
        read(
            jobID, live: { run in NodeListRead.nodes(run.nodeSnapshots(includeResults: true)) },
            storedThen: { answer in
                if let shown = self.settledJobs.nodeList(of: jobID) { return answer(.success(.shown(shown))) }
                self.whenLargeReadsAllow(jobID) {
                    if let shown = self.settledJobs.nodeList(of: jobID) { return answer(.success(.shown(shown))) }
                    self.storedNodeLists.read(jobID, answer) { try self.readStoredNodeList(jobID: jobID, renderNodeList) }
                }
            }) { read in
                completion(read.map { found in
                    if case .nodes(let nodes) = found { return .nodes(nodes.inTreeOrder()) }
                    return found
                })
            }
    }

    /// A stored job's nodes with their results: a settled job's shown once (`AnswerRendering.nodeListWithResultText`,
    /// or `renderNodeList` of its results read as values) and noted for the reads meanwhile. On a read queue.
    private func readStoredNodeList(
        jobID: String, _ renderNodeList: @Sendable ([NodeRecord]) -> [UInt8]
    ) throws -> NodeListRead {
        // Taken before the read, as for a job's answer.
        let removals = settledJobs.removals
        let found: StoredNodeListShown<SettledAnswer>
        if let nodeListWithResultText = rendering.nodeListWithResultText {
            found = try store.showStoredNodeList(jobID: jobID, nodeListWithResultText)
        } else {
            found = try store.stateAndNodes(jobID: jobID, includeResults: true)
                .map { .nodes($0.state, $0.nodes) } ?? .notFound
        }
        let shown: SettledAnswer
        switch found {
        case .notFound:
            return .notFound
        case .nodes(let state, let nodes):
            // Put in tree order below, as a live run's are.
            guard state.isSettled else { return .nodes(nodes) }
            shown = SettledAnswer(renderNodeList(nodes.inTreeOrder()))
        case .shown(let answer):
            shown = answer
        }
        settledJobs.noteNodeList(shown, of: jobID, ifNoRemovalSince: removals)
        memoryReturn.answerMade(bytes: shown.count)
        return .shown(shown)
    }

    /// One node with its result, or which of job and node is missing.
    public func node(jobID: String, nodeID: String, _ completion: @escaping @Sendable (Result<NodeLookup, Error>) -> Void) {
        read(
            jobID, live: { run in run.graph.index(ofNodeID: nodeID).map { .found(run.nodeSnapshot($0)) } ?? .noSuchNode },
            stored: {
                if let node = try self.store.node(jobID: jobID, nodeID: nodeID) { return .found(node) }
                return try self.store.jobState(id: jobID) == nil ? .noSuchJob : .noSuchNode
            }, completion)
    }

    /// A fetch node's raw response body, read on a read queue once what was queued before is committed;
    /// `completion` runs once, on that queue.
    public func body(
        jobID: String, nodeID: String, _ completion: @escaping @Sendable (Result<StoredBody?, Error>) -> Void
    ) {
        readAfterCommit({ try self.store.body(jobID: jobID, nodeID: nodeID) }, completion)
    }

    /// Waits, for at most `milliseconds`, until `accept` holds for the number of long-polls waiting on jobs running
    /// here (`EngineMetrics.longPollsWaiting`), looking at once and after each change; the answer is whether it held.
    public func waitForLongPolls(milliseconds: Int64, until accept: (Int) -> Bool) -> Bool {
        longPollCount.wait(milliseconds: milliseconds, until: accept)
    }

    /// A snapshot of the counters for `/metrics`, from what the engine keeps as it goes (no store read).
    public func metrics(_ completion: @escaping @Sendable (EngineMetrics) -> Void) {
        queue.async {
            var m = EngineMetrics()
            for state in NodeState.allCases {
                m.jobsByState[state] = self.jobsByState[state] ?? 0
                m.nodesByState[state] = self.nodesByState[state] ?? 0
            }
            m.activeJobs = self.unsettledJobs
            // Fetches the fetcher holds beyond their host's slots wait for a slot there, not on the wire.
            m.pendingFetches = self.fetchQueue.waiting + self.fetchQueue.heldBeyondSlots
            m.fetchesInFlight = self.fetchQueue.inFlight - self.fetchQueue.heldBeyondSlots
            m.jobLoadFailures = self.jobLoadFailures
            // Summed over the jobs being waited on, not over every job.
            m.longPollsWaiting = self.waiters.count
            m.scheduledJobs = self.timekeeper.scheduledJobs
            m.waitingForKey = self.gate.totalWaiting
            m.responseMemoryBytes = self.responseMemory?.usedBytes ?? 0
            m.activeNodes = self.nodeRoom.held
            m.transfer.rateLimitWaitMs = Int(self.fetchQueue.rateWaitNs / 1_000_000)
            m.transfer.rateLimitedFetches = self.fetchQueue.rateLimitedStarts
            m.transfer.coalescedFetches = self.sharedTransfers.coalescedCount
            if let cache = self.httpCache?.metrics {
                m.transfer.cacheOutcomes = cache.cacheOutcomes
                m.transfer.cacheBytes = cache.cacheBytes
                m.transfer.cacheEntries = cache.cacheEntries
            }
            let snapshot = m
            self.onReadQueue { completion(snapshot) }
        }
    }

    // MARK: - Cancelling and deleting

    /// Cancels every unsettled node of the job. `completion` runs once, on some other thread, when the
    /// store has committed the job's cancelled state and its nodes' (an answer promises they survive a crash),
    /// or with the error that kept them from being written. Nothing runs on the caller's thread (an event loop):
    /// a job in memory is cancelled in a turn of the engine's queue, one that is not is read on a read queue.
    public func cancel(id: String, _ completion: @escaping @Sendable (Result<CancelOutcome, Error>) -> Void) {
        queue.async { [self] in
            if let live = cancelLive(id) { return answerAfterCommit(live, completion) }
            onReadQueue { [self] in cancelNotLive(id: id, completion) }
        }
    }

    /// `cancel` of a job that was not in memory when the engine's queue looked; on a read queue.
    private func cancelNotLive(id: String, _ completion: @escaping @Sendable (Result<CancelOutcome, Error>) -> Void) {
        do {
            guard let job = try store.job(id: id) else { return completion(.success(.notFound)) }
            if let settled = Self.cancelOutcome(ofSettled: job) { return completion(.success(settled)) }
            if job.dueAt != nil { return timekeeper.cancelWaiting(id: id, completion) }
            // Unfinished in the store yet not running here when we looked: it started, or finished and was
            // retired (which happens only once its last state is committed), between the two looks.
            if let live = queue.sync(execute: { cancelLive(id) }) { return answerAfterCommit(live, completion) }
            guard let again = try store.job(id: id) else { return completion(.success(.notFound)) }
            if let settled = Self.cancelOutcome(ofSettled: again) { return completion(.success(settled)) }
            cancelElsewhere(id: id, completion)
        } catch {
            completion(.failure(error))
        }
    }

    /// Cancels the job if this engine runs it and hands its nodes' new states to the store; on the queue.
    /// `nil` when the job is not in memory.
    func cancelLive(_ id: String) -> Result<CancelOutcome, Error>? {
        guard let run = visibleRun(id) else { return nil }
        if shuttingDown || run.stopping { return .failure(EngineError.shuttingDown("the server is shutting down")) }
        if let settled = Self.cancelOutcome(ofSettled: run.record) { return .success(settled) }
        run.cancel()
        flushDirty()
        return .success(.cancelling(run.record))
    }

    /// What a cancel answers for a job that is settled already; `nil` for one still pending or running.
    static func cancelOutcome(ofSettled job: JobRecord) -> CancelOutcome? {
        switch job.state {
        case .cancelled: return .alreadyCancelled(job)
        case .succeeded, .failed, .skipped: return .alreadySettled(job)
        case .pending, .running: return nil
        }
    }

    /// Passes `outcome` on once everything handed to the store so far is committed. An answer about a job in
    /// memory waits too: its state may still be on its way to the disk.
    func answerAfterCommit(
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

    /// Deletes a settled job with its nodes and bodies. `completion` runs once, on some other thread; with
    /// `.deleted` once the deletion is committed, so that no later read finds the job. Holds no thread meanwhile:
    /// the job is looked at on `queue`, the store read on a read queue once what came before is committed.
    public func delete(id: String, _ completion: @escaping @Sendable (Result<DeleteOutcome, Error>) -> Void) {
        queue.async {
            if let run = self.visibleRun(id) {
                if !run.record.state.isSettled {
                    let job = run.record
                    self.onReadQueue { completion(.success(.active(job))) }
                    return
                }
                // Settled, but children left running by `cancel_remaining: false`: stop them quietly.
                run.stop()
                self.forget(run)
            }
            // The stored state, once what came before is committed: a job still pending or running there is refused.
            self.readAfterCommit({ () -> (state: NodeState?, active: JobRecord?) in
                let state = try self.store.jobState(id: id)
                guard let state, !state.isSettled else { return (state, nil) }
                return (state, try self.store.jobWithoutRequest(id: id))
            }) { looked in
                switch looked {
                case .failure(let error): completion(.failure(error))
                case .success((_, let active?)): completion(.success(.active(active)))
                case .success((let state, nil)): self.deleteStored(id: id, state: state, completion)
                }
            }
        }
    }

    /// Deletes a job that is not in memory, whose stored state was `state`.
    private func deleteStored(
        id: String, state: NodeState?, _ completion: @escaping @Sendable (Result<DeleteOutcome, Error>) -> Void
    ) {
        store.deleteJob(id: id) { deleted in
            // On the store's thread, after the commit.
            switch deleted {
            case .failure(let error):
                completion(.failure(error))
            case .success(false):
                completion(.success(.notFound))
            case .success(true):
                self.forgetDeleted([id])
                if let state { self.queue.async { self.jobsByState[state, default: 0] -= 1 } }
                completion(.success(.deleted))
            }
        }
    }

    /// As `delete(id:_:)`, blocking the calling thread until the answer: for tools and tests, which may wait.
    public func delete(id: String) throws -> DeleteOutcome {
        try waitForCompletion { done in delete(id: id, done) }.get()
    }

    // MARK: - Long-polling

    /// Calls back once: as soon as the job's version exceeds `afterVersion` (without it: as soon as the job is
    /// settled), or after `timeoutMs` with the job as it is; with `nil` if there is no such job. Holds no thread
    /// while it waits, and never waits on the caller's: the job is looked at on `queue`, read from the store and
    /// its answer made on a read queue.
    /// - Returns: a token to stop waiting (the client went away); cancelling it after the callback ran does nothing.
    @discardableResult
    public func waitForChange(
        id: String, afterVersion: Int64?, timeoutMs: Int, _ callback: @escaping @Sendable (JobRecord?) -> Void
    ) -> Cancellable {
        let waiter = Waiter(afterVersion: afterVersion, engine: self, jobID: id, takesAnswers: false) { read in
            // Never `.settled`: this waiter does not take answers.
            if case .record(let job) = read { callback(job) } else { callback(nil) }
        }
        queue.async { self.register(waiter, timeoutMs: timeoutMs) }
        return waiter
    }

    /// `waitForChange` for `GET /v1/jobs/{id}?wait=`: the same, but a settled job that changes no more comes as its
    /// answer made once (`.settled`), shared by every long-poll it satisfies and kept as `readJob` keeps it, rather
    /// than as a record each of them shows again.
    @discardableResult
    public func waitForAnswer(
        id: String, afterVersion: Int64?, timeoutMs: Int, _ callback: @escaping @Sendable (JobRead) -> Void
    ) -> Cancellable {
        let waiter = Waiter(afterVersion: afterVersion, engine: self, jobID: id, takesAnswers: true, callback: callback)
        queue.async { self.register(waiter, timeoutMs: timeoutMs) }
        return waiter
    }

    /// Answers `waiter` at once from the run in memory, or keeps it until the run changes; a job not in memory is
    /// looked up in the store, unless it is known to wait there for its time (`scheduled`): then the waiter is
    /// kept until the job is taken in or cancelled. On the queue.
    private func register(_ waiter: Waiter, timeoutMs: Int, scheduled: Bool = false) {
        guard !waiter.done else { return }  // cancelled before it got here
        let id = waiter.jobID
        let run = visibleRun(id)
        if run == nil, !scheduled {
            let shuttingDown = self.shuttingDown
            onReadQueue { self.waitForStored(waiter, timeoutMs: timeoutMs, shuttingDown: shuttingDown) }
            return
        }
        if shuttingDown || timeoutMs <= 0 || run.map({ waiter.isSatisfied(by: $0.record) }) == true {
            return answer([waiter], live: run, jobID: id)
        }
        waiters.add(waiter, jobID: id)
        if waiter.takesAnswers { run?.writeAnswerTexts() }
        armTimeout(waiter, jobID: id, timeoutMs: timeoutMs)
    }

    /// A job that is not running here: a settled job changes no more, except by being deleted. On a read queue.
    private func waitForStored(_ waiter: Waiter, timeoutMs: Int, shuttingDown: Bool) {
        let id = waiter.jobID
        if waiter.takesAnswers, rendering.settled != nil, (try? store.jobState(id: id))??.isSettled == true {
            // Its answer, made once and shared with the other reads of it, if it satisfies the waiter now.
            return readStored(id) { read in
                if case .success(.settled(let settled)) = read,
                    waiter.isSatisfied(version: settled.version, settled: true) || timeoutMs <= 0 || shuttingDown
                {
                    return waiter.fire(.settled(settled))
                }
                self.waitForStoredRecord(waiter, timeoutMs: timeoutMs, shuttingDown: shuttingDown)
            }
        }
        waitForStoredRecord(waiter, timeoutMs: timeoutMs, shuttingDown: shuttingDown)
    }

    /// `waitForStored` with the job's record.
    private func waitForStoredRecord(_ waiter: Waiter, timeoutMs: Int, shuttingDown: Bool) {
        let id = waiter.jobID
        guard let job = (try? storedJob(id: id)) ?? nil else { return waiter.fire(nil) }
        if waiter.isSatisfied(by: job) || timeoutMs <= 0 || shuttingDown { return waiter.fire(job) }
        // A job waiting in the store for its time is answered as soon as it changes, as a running one is.
        if job.dueAt != nil { return queue.async { self.register(waiter, timeoutMs: timeoutMs, scheduled: true) } }
        // Another server runs it: its changes are announced (API.md §10).
        if shared != nil { waitRemotely(waiter, id: id) }
        let timer = DispatchWorkItem { [weak self, waiter] in
            waiter.fire((try? self?.storedJob(id: id)) ?? nil)
        }
        if waiter.arm(timer) {
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(timeoutMs), execute: timer)
        }
    }

    /// Forgets a waiter that will not be answered through `notifyWaiters`; on the queue.
    func dropWaiter(_ waiter: Waiter, jobID: String) {
        waiters.remove(waiter, jobID: jobID)
    }

    /// Answers `waiter` with the job as it is once `timeoutMs` have passed without a change; on the queue.
    func armTimeout(_ waiter: Waiter, jobID id: String, timeoutMs: Int) {
        let timer = DispatchWorkItem { [weak self, waiter] in
            guard let self, !waiter.done else { return }
            self.dropWaiter(waiter, jobID: id)
            self.answer([waiter], live: self.visibleRun(id), jobID: id)
        }
        if waiter.arm(timer) { queue.asyncAfter(deadline: .now() + .milliseconds(timeoutMs), execute: timer) }
    }

    /// Answers `waiters` with the job as it is now: `run`'s record, taken on the queue, else the stored one. The
    /// store is read and the answers made on a read queue: a job of many results takes long to show, and the queue
    /// runs every job. A run that changes no more (settled, every node too) is shown once for the waiters that
    /// take answers, and its answer kept as a read of it from the store would keep it. On the queue.
    func answer(_ waiters: [Waiter], live run: JobRun?, jobID id: String) {
        let live = run.map(shownRecord)
        let final = run.map { $0.record.state.isSettled && $0.unsettledNodes == 0 } ?? false
        let texts = final ? run?.takeAnswerTexts() : nil
        // Taken here: a deletion after this turn must not be undone by keeping what is shown from it.
        let removals = settledJobs.removals
        onReadQueue {
            guard let live else {
                let job = (try? self.storedJob(id: id)) ?? nil
                for waiter in waiters { waiter.fire(job) }
                return
            }
            var settled: SettledJob?
            if final, let renderSettled = self.rendering.settled, waiters.contains(where: \.takesAnswers) {
                if let kept = self.settledJobs[id] {
                    settled = kept
                } else {
                    let made =
                        self.settledAnswer(live, texts: texts)
                        ?? SettledJob(id: live.id, version: live.version, body: renderSettled(live))
                    self.settledJobs.insert(made, ifNoRemovalSince: removals)
                    settled = made
                }
            }
            for waiter in waiters {
                if waiter.takesAnswers, let settled {
                    waiter.fire(.settled(settled))
                } else {
                    waiter.fire(live)
                }
            }
        }
    }

    /// The settled answer of `live` whose result is a list written as text ahead of the rest (in memory, as
    /// `AnswerRendering.settled` makes it): from the texts of its root list's children where they are all there to
    /// match its entries, else, for a list of many entries, on every core at once (`EntryRuns`). `nil` for any other
    /// result.
    /// Writing to memory fails on nothing but the memory itself; should it throw, the answer is made from the values.
    private func settledAnswer(_ live: JobRecord, texts: AnswerTexts?) -> SettledJob? {
        guard let settledAround = rendering.settledAround, case .array(let entries)? = live.result else { return nil }
        let result =
            if let texts, texts.texts.count == entries.count {
                texts.resultText(entries)
            } else {
                EntryRuns.resultText(
                    entries, runs: CoreRuns.count, minimumEntries: configuration.answerRunsMinimumEntries,
                    nice: reads.nice)
            }
        guard let result, let answer = try? settledAround(live, result) else { return nil }
        return SettledJob(id: live.id, version: live.version, answer: answer)
    }

    fileprivate func removeWaiter(_ waiter: Waiter, jobID: String) {
        queue.async { self.dropWaiter(waiter, jobID: jobID) }
    }

    // MARK: - Event streams

    /// Calls `handler` with the job's changes as they happen (API.md §8 events): first the job (and, from
    /// `afterVersion`, the nodes changed at or after it), then a batch per change of node states, until a last batch
    /// when the job settles or the server stops; `nil` once if there is no such job. Calls come in order on one
    /// queue shared by all streams; no thread waits meanwhile.
    /// - Returns: a token that stops the calls (the client went away).
    public func watchEvents(
        id: String, afterVersion: Int64?, _ handler: @escaping @Sendable (JobEventBatch?) -> Void
    ) -> Cancellable {
        let subscriber = JobEventSubscriber(jobID: id, handler: handler)
        subscriber.engine = self
        queue.async {
            if let run = self.visibleRun(id) {
                if self.shuttingDown {
                    let batch = JobEventBatch(job: run.record, nodes: [], jobStateChanged: true, isLast: true)
                    self.eventHub.fanOut.async { subscriber.deliver(batch) }
                } else {
                    self.eventHub.add(subscriber, run: run, afterVersion: afterVersion)
                }
                return
            }
            // Not in memory: settled (or not running here), so it changes no more; one batch says all.
            let fanOut = self.eventHub.fanOut
            self.onReadQueue {
                let batch: JobEventBatch?
                do {
                    if let job = try self.storedJob(id: id) {
                        var nodes: [NodeRecord] = []
                        // Another server runs it (API.md §10): followed from the store until it settles.
                        let remote = self.shared != nil && !job.state.isSettled
                        // At or after: a client cut off among the events of the job's last version needs them again.
                        let resumed = afterVersion.map { $0 <= job.version } ?? false
                        if remote || resumed {
                            nodes = try self.store.nodes(jobID: id, includeResults: false)
                        }
                        if remote {
                            let first = JobEventBatch(job: job, nodes: resumed ? nodes : [], jobStateChanged: true, isLast: false)
                            return self.streamRemotely(subscriber, first: first, nodes: nodes)
                        }
                        batch = JobEventBatch(job: job, nodes: nodes, jobStateChanged: true, isLast: true)
                    } else {
                        batch = nil
                    }
                } catch {
                    self.logger.error("event stream could not read the job", ["job": .string(id), "error": .string("\(error)")])
                    batch = nil
                }
                fanOut.async { subscriber.deliver(batch) }
            }
        }
        return subscriber
    }

    func removeEventSubscriber(_ subscriber: JobEventSubscriber) {
        queue.async { self.eventHub.remove(subscriber) }
    }

    // MARK: - Called by runs, on the queue

    func enqueueFetch(run: JobRun, node: Int, host: String) {
        fetchQueue.enqueue(FetchQueue.Ticket(jobID: run.id, node: node), host: host)
        schedulePump()
    }

    func fetchFinished(host: String) {
        giveBackSlot(of: host)
        // The freed slot is given out now, before the finished fetch's outcome is taken in, rather than by a pump
        // queued behind everything else waiting on the queue: with all slots busy, that wait is what bounds the rate.
        pumpFetches()
    }

    private func giveBackSlot(of host: String) {
        fetchQueue.finished(host: host)
        shared?.releaseHostSlot(host)
    }

    /// A finished fetch on its way from the fetcher's thread to `queue`: the host whose slot it gives back (`nil`
    /// when `takeIn` decides), and what takes its outcome in.
    struct EndedFetch: Sendable {
        let host: String?
        let takeIn: @Sendable () -> Void
    }

    /// Hands a finished fetch from the fetcher's thread to `queue`. Fetches that end while earlier ones wait there
    /// are taken in on the same turn: one hop per batch rather than one per fetch (a 10,000-fetch job ends them
    /// by the dozen per pass of the fetcher's loop). On that turn every slot given back is handed out again
    /// first, then each outcome is taken in, in the order they ended.
    func fetchEnded(slotOf host: String?, _ takeIn: @escaping @Sendable () -> Void) {
        let first = endedFetches.withLock { list -> Bool in
            list.append(EndedFetch(host: host, takeIn: takeIn))
            return list.count == 1
        }
        if first { queue.async { self.takeInEndedFetches() } }
    }

    private func takeInEndedFetches() {
        pumpFetchesMidTurn()
        let held = heldTakeIns
        heldTakeIns = []
        for takeIn in held { takeIn() }
    }

    /// `pumpFetches`, after giving back the slots of the fetches that ended meanwhile, so that the pump fills them;
    /// their outcomes wait in `heldTakeIns`, in the order they ended. Also called in the middle of a long turn (a
    /// large list starting its children): starting 100,000 children took 230 ms of one turn, in which the fetcher,
    /// its first slots done, sat idle. Those outcomes are taken in after the turn by the `takeInEndedFetches` that
    /// `fetchEnded` queued for them: whatever is in `endedFetches` has one queued that has not yet run.
    func pumpFetchesMidTurn() {
        let ended = endedFetches.withLock { list -> [EndedFetch] in
            let taken = list
            list = []
            return taken
        }
        for fetch in ended {
            if let host = fetch.host { giveBackSlot(of: host) }
            heldTakeIns.append(fetch.takeIn)
        }
        pumpFetches()
    }

    func schedulePump() {
        guard !pumpScheduled else { return }
        pumpScheduled = true
        queue.async { self.pumpFetches() }
    }

    /// Begins the queued fetches that have slots now. Also called in the middle of a turn that queues many (a large
    /// list starting): a fetch is begun only once its node's deferred is in place, which holds for every child the
    /// list has started.
    func pumpFetches() {
        pumpScheduled = false
        // Called again from inside its own loop, it leaves the freed slot to that loop's next turn: recursing would
        // go as deep as the fetches that join transfers in flight.
        guard !pumping else { return }
        pumping = true
        defer { pumping = false }
        // A server unsure of its leases begins nothing: another may be taking its jobs over (fencing stops
        // their writes, this stops their transfers).
        guard !shuttingDown, shared?.leasesHold ?? true else { return }
        while let (ticket, host) = fetchQueue.next() {
            if let shared {
                beginWithHostSlot(ticket, host: host, shared)
                continue
            }
            if let run = runs[ticket.jobID], run.beginTransfer(ticket.node, host: host) { continue }
            fetchQueue.finished(host: host)  // no longer wanted: give the slot back
        }
        if let due = fetchQueue.rateDueNs { pumpAtRateDue(due) }
    }

    /// With servers sharing a database, a fetch that has this server's slot for its host also takes one of the
    /// host's slots over all servers (`--max-per-host` holds over all of them, API.md §10) before it begins; it
    /// keeps this server's slot while it waits. On the queue.
    private func beginWithHostSlot(_ ticket: FetchQueue.Ticket, host: String, _ shared: SharedJobStore) {
        shared.acquireHostSlot(host, limit: configuration.maxPerHost) { taken in
            self.queue.async {
                // Leases in doubt since the fetch began waiting for its slot: another server may be taking the job
                // over, so the fetch queues again (pumps resume at the next renewal) rather than begins.
                let hold = shared.leasesHold
                if taken, hold, !self.shuttingDown, self.runs[ticket.jobID] != nil,
                    let perSecond = self.fetchQueue.rateLimiter.perSecond(hostKey: host), let rates = shared as? SharedHostRates
                {
                    return self.beginAtSharedRate(ticket, host: host, perSecond: perSecond, rates, shared)
                }
                if taken, hold, !self.shuttingDown, let run = self.runs[ticket.jobID], run.beginTransfer(ticket.node, host: host) {
                    return
                }
                // No longer wanted (or the store closed, or the leases in doubt): both slots go back.
                self.fetchQueue.finished(host: host)
                if taken { shared.releaseHostSlot(host) }
                if taken, !hold, !self.shuttingDown, self.runs[ticket.jobID] != nil { self.fetchQueue.enqueue(ticket, host: host) }
                self.schedulePump()
            }
        }
    }

    /// With servers sharing a database, a fetch to a host with a `--host-rate` books its start in the store (the
    /// rate holds over all servers, API.md §10) once it holds both slots, and keeps them while it waits for it.
    /// On the queue.
    private func beginAtSharedRate(
        _ ticket: FetchQueue.Ticket, host: String, perSecond: Double, _ rates: SharedHostRates, _ shared: SharedJobStore
    ) {
        rates.awaitHostStart(HostRateLimiter.hostName(of: host), perSecond: perSecond, jobID: ticket.jobID) { heldNs in
            self.queue.async {
                if let heldNs { self.fetchQueue.rateWaited(ns: heldNs) }
                let wanted = heldNs != nil && !self.shuttingDown && self.runs[ticket.jobID] != nil
                // Leases in doubt since the booking: the fetch queues again, as in `beginWithHostSlot`.
                let hold = shared.leasesHold
                if wanted, hold, let run = self.runs[ticket.jobID], run.beginTransfer(ticket.node, host: host) {
                    return
                }
                self.fetchQueue.finished(host: host)
                shared.releaseHostSlot(host)
                if wanted, !hold { self.fetchQueue.enqueue(ticket, host: host) }
                self.schedulePump()
            }
        }
    }

    /// Pumps again when a fetch held back by `--host-rate` may start; one timer per distinct due time.
    private func pumpAtRateDue(_ dueNs: UInt64) {
        if let armed = rateTimerDueNs, armed <= dueNs { return }
        rateTimerDueNs = dueNs
        queue.asyncAfter(deadline: DispatchTime(uptimeNanoseconds: dueNs)) {
            if self.rateTimerDueNs == dueNs { self.rateTimerDueNs = nil }
            self.schedulePump()
        }
    }

    /// The run of job `id` as requests about the job find it: not one whose creation has not committed yet
    /// (`JobRun.provisional`), which no client has heard of and which may still be dropped.
    func visibleRun(_ id: String) -> JobRun? {
        guard let run = runs[id], !run.provisional else { return nil }
        return run
    }

    func markDirty(_ run: JobRun) {
        // Its changes wait in the run for its creation's commit (`confirmStart`).
        if run.provisional { return }
        dirtyRuns[ObjectIdentifier(run)] = run
        guard !flushScheduled else { return }
        flushScheduled = true
        queue.async { self.flushDirty() }
    }

    /// Hands the changes of this turn to the store in one batch and answers the long-polls they satisfy.
    func flushDirty() {
        flushScheduled = false
        guard !dirtyRuns.isEmpty else { return }
        var jobs: [JobRecord] = []
        var nodes: [NodeRecord] = []
        var bodies: [(jobID: String, nodeID: String, body: StoredBody)] = []
        let batch = dirtyRuns.values
        dirtyRuns.removeAll()
        // Made to size: a node record is a few hundred bytes, and a job of 10,000 nodes hands them all over at once.
        nodes.reserveCapacity(batch.reduce(0) { $0 + $1.dirtyNodes.count })
        // Urgent (the store writes it at once, not on idle CPU time): a fetch ended that a crash would make again
        // though it may not be repeated. A job that settles is urgent by itself.
        var urgent = false
        for run in batch {
            eventHub.record(run, dirty: run.dirtyNodes)
            if run.dirtyJob { jobs.append(run.record) }
            for i in run.dirtyNodes.sorted() {
                nodes.append(run.nodes[i])
                if !urgent, run.nodes[i].state.isSettled, case .fetch(let request) = run.graph.nodes[i].kind, !request.idempotent {
                    urgent = true
                }
            }
            if writesAsItRuns(run) { urgent = true }
            bodies.append(contentsOf: run.pendingBodies)
            run.dirtyJob = false
            run.dirtyNodes.removeAll(keepingCapacity: true)
            run.pendingBodies.removeAll()
        }
        store.enqueue(jobs: jobs, nodes: nodes, bodies: bodies, urgent: urgent)
        for run in batch {
            notifyWaiters(run)
            if run.record.state.isSettled && run.unsettledNodes == 0 { retire(run) }
        }
    }

    /// Whether the store should write `run`'s changes now, with those it holds, rather than hold them on: every
    /// `maxActiveNodes / 2` node changes of a job larger than that bound, which runs alone (a node makes two: it
    /// starts, it settles). The store's writer holds changes at idle priority until a job settles (docs/store.md),
    /// which within the bound is at most the bound's worth. Held to the end, a job of 100,000 fetches of a 21-byte
    /// file had 100,000 records in the writer's table and 96,000 more in its queue, which the idle writer found no
    /// CPU time to merge: 60 MB of its 278 MB heap peak (heaptrack), and 367–372 MiB of RSS. Written every 10,000
    /// changes as its fetches run, it peaks at 238–250 MiB (four runs; 245–289 every 20,000). Counted per job, not
    /// in the store: a bound on all the changes the writer holds was reached by a job of 10,000 fetches too, whose
    /// early write made it 8 % slower (512 against 474 ms, medians of 8 alternated).
    private func writesAsItRuns(_ run: JobRun) -> Bool {
        let bound = configuration.maxActiveNodes
        guard bound > 0, run.nodes.count > bound else { return false }
        run.changesHeld += run.dirtyNodes.count
        guard run.changesHeld >= bound / 2 else { return false }
        run.changesHeld = 0
        return true
    }

    private func notifyWaiters(_ run: JobRun) {
        guard waiters.hasWaiters(jobID: run.id) else { return }
        let satisfied = waiters.take(jobID: run.id) { $0.isSatisfied(by: run.record) }
        if !satisfied.isEmpty { answer(satisfied, live: run, jobID: run.id) }
    }

    func jobStateChanged(_ run: JobRun) {
        logger.info("job state", ["job": .string(run.id), "state": .string(run.record.state.rawValue), "version": .int(run.record.version)])
        if run.record.state.isSettled {
            unsettledJobs -= 1
            leaveGate(run)
        }
        let state = run.record.state
        if let counted = countedJobState[run.id], counted != state {
            jobsByState[counted, default: 0] -= 1
            jobsByState[state, default: 0] += 1
            countedJobState[run.id] = state
        }
    }

    /// A map of a run in memory added `count` pending nodes.
    func nodesAdded(_ count: Int) {
        nodesByState[.pending, default: 0] += count
    }

    /// A node of a run in memory moved from `old` to `new`.
    func nodeStateChanged(from old: NodeState, to new: NodeState) {
        nodesByState[old, default: 0] -= 1
        nodesByState[new, default: 0] += 1
    }

    /// A finished job stays readable from memory until the store has committed its last state.
    /// Finished jobs wait here for the commit of their last state; one wait serves all of them, and holds no thread.
    private func retire(_ run: JobRun) {
        guard runs[run.id] === run else { return }
        retiring.append(run)
        guard !retireScheduled else { return }
        retireScheduled = true
        // In a later turn, so that the jobs finishing meanwhile share the wait.
        queue.async { self.forgetRetiringOnceCommitted() }
    }

    /// On the queue, while `retireScheduled`.
    private func forgetRetiringOnceCommitted() {
        // Their last states were handed to the store before they got here.
        awaitingCommit = retiring
        retiring.removeAll()
        // Until then (a full disk retried for a while) they stay in memory, where reads find them.
        store.whenCommitted { _ in
            self.queue.async {
                var batch = self.awaitingCommit
                self.awaitingCommit = []
                for run in batch { self.forget(run) }
                let nodes = batch.reduce(0) { $0 + $1.nodes.count }
                let jobsWait = self.nodeRoom.jobsWait
                self.letGo(&batch) { self.memoryReturn.runsLeft(nodes: nodes, jobsWaitForRoom: jobsWait) }
                if self.retiring.isEmpty {
                    self.retireScheduled = false
                } else {
                    self.forgetRetiringOnceCommitted()
                }
            }
        }
    }

    /// Lets go of `runs`, which have left memory, on `releaseQueue`, then calls `then` there. A run of 100,000
    /// nodes is millions of allocations (its graph, records and results): freed where its last reference happened
    /// to go, the store's writer, whose commit callback held it, spent 30 % of its samples in the 6 s after such a
    /// job's answer on it (`perf`), with every submission's commit waiting behind; the engine's queue would have
    /// held every job. `runs` is emptied before the release is queued, so the queue holds the last reference
    /// (unless something else still holds a run, which then frees it when it lets go).
    private func letGo(_ runs: inout [JobRun], then: @escaping @Sendable () -> Void) {
        let held = Locked<[JobRun]>([])
        held.withLock { swap(&$0, &runs) }
        releaseQueue.async {
            held.withLock { $0 = [] }
            then()
        }
    }

    func forget(_ run: JobRun) {
        guard runs[run.id] === run else { return }
        runs[run.id] = nil
        _ = run.takeAnswerTexts()
        giveBack(run.roomHeld)
        run.roomHeld = 0
        memoryReturn.runEnded(run.id)
        countedJobState[run.id] = nil
        eventHub.forget(run.id)
        for state in NodeState.allCases { nodesByState[state, default: 0] -= run.record.progress[state] }
        if !run.record.state.isSettled { unsettledJobs -= 1 }
        fetchQueue.removeJob(run.id)
        if !fetchQueue.rateLimiter.isEmpty, let rates = shared as? SharedHostRates { rates.withdrawHostStarts(jobID: run.id) }
        shared?.released(jobID: run.id)
    }

    /// Gives back the room `nodes` held; when jobs wait in the store for room, the timekeeper looks at once.
    func giveBack(_ nodes: Int) {
        if nodes > 0, nodeRoom.give(nodes) { timekeeper.scheduled(dueAt: Timestamp.nowMs()) }
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
            // Settled jobs change no more, so what the sweep will delete can be counted before it does.
            let swept = try store.settledJobCounts(finishedBeforeMs: cutoff)
            let n = try store.sweep(finishedBeforeMs: cutoff)
            if n > 0 {
                forgetDeleted(nil)
                queue.async { for (state, count) in swept { self.jobsByState[state, default: 0] -= count } }
            }
            if n > 0 { logger.info("retention sweep", ["deleted": .int(n)]) }
            return n
        } catch {
            logger.error("retention sweep failed", ["error": .string(String(describing: error))])
            return 0
        }
    }
}

/// The long-polls waiting on jobs running here, by job, and how many there are in all.
struct WaiterTable {
    private var byJob: [String: [Waiter]] = [:]
    private(set) var count = 0

    func hasWaiters(jobID: String) -> Bool { byJob[jobID] != nil }

    mutating func add(_ waiter: Waiter, jobID: String) {
        byJob[jobID, default: []].append(waiter)
        count += 1
    }

    mutating func remove(_ waiter: Waiter, jobID: String) {
        guard var list = byJob[jobID], let index = list.firstIndex(where: { $0 === waiter }) else { return }
        list.remove(at: index)
        byJob[jobID] = list.isEmpty ? nil : list
        count -= 1
    }

    /// Takes out the job's waiters that `chosen` picks (every one without it).
    mutating func take(jobID: String, where chosen: (Waiter) -> Bool = { _ in true }) -> [Waiter] {
        guard let list = byJob.removeValue(forKey: jobID) else { return [] }
        var taken: [Waiter] = []
        var left: [Waiter] = []
        for waiter in list {
            if chosen(waiter) { taken.append(waiter) } else { left.append(waiter) }
        }
        if !left.isEmpty { byJob[jobID] = left }
        count -= taken.count
        return taken
    }

    mutating func takeAll() -> [String: [Waiter]] {
        defer {
            byJob = [:]
            count = 0
        }
        return byJob
    }
}

/// One long-poll waiting for a job to change.
final class Waiter: Cancellable, @unchecked Sendable {
    // @unchecked: `callback` and `timer` are guarded by `lock`; `engine` is set in `init` and never after, so it is
    // only read once the waiter is shared.
    let afterVersion: Int64?
    let jobID: String
    /// Takes a settled job's answer made once (`.settled`) in place of its record.
    let takesAnswers: Bool
    private let lock = Lock()
    // Both guarded by `lock`; the timer's block holds the waiter, so it is let go once the waiter is done.
    private var callback: (@Sendable (JobRead) -> Void)?
    private var timer: DispatchWorkItem?
    private weak var engine: Engine?

    init(
        afterVersion: Int64?, engine: Engine, jobID: String, takesAnswers: Bool,
        callback: @escaping @Sendable (JobRead) -> Void
    ) {
        self.afterVersion = afterVersion
        self.engine = engine
        self.jobID = jobID
        self.takesAnswers = takesAnswers
        self.callback = callback
    }

    var done: Bool { lock.withLock { callback == nil } }

    func isSatisfied(by job: JobRecord) -> Bool {
        isSatisfied(version: job.version, settled: job.state.isSettled)
    }

    func isSatisfied(version: Int64, settled: Bool) -> Bool {
        if let afterVersion { return version > afterVersion }
        return settled
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
        fire(job.map(JobRead.record) ?? .notFound)
    }

    /// Answers once; later calls do nothing. `.settled` only to a waiter that `takesAnswers`.
    func fire(_ read: JobRead) {
        finish()?(read)
    }

    /// Stops waiting without answering.
    func cancel() {
        _ = finish()
        engine?.removeWaiter(self, jobID: jobID)
    }

    /// Marks the waiter done and stops its timer; returns the callback if it had not run yet.
    private func finish() -> (@Sendable (JobRead) -> Void)? {
        let (cb, timer): ((@Sendable (JobRead) -> Void)?, DispatchWorkItem?) = lock.withLock {
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

/// A fixed set of serial queues for reads: at most this many threads read at once, and each piece of work goes to
/// the queue with the least waiting, so a small read does not queue behind a read of many megabytes while another
/// queue is idle.
final class ReadPool: Sendable {
    let queues: [DispatchQueue]
    /// Work items given to each queue and not finished.
    private let waiting: [Counter]

    private final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    /// Reads run `niceIncrement` below the priority of the thread that made the pool (the process's, which the
    /// event loops keep): rendering a 100 MB answer then yields the CPU to the loops, whose work is short, instead
    /// of sharing it equally with them while `/healthz` waits.
    static let niceIncrement: Int32 = 5
    /// On Linux, libdispatch gives the worker threads of each quality-of-service class a fixed nice value when it
    /// starts them (`.utility`: 2), not one relative to the process, so the pool raises it to `nice` itself. The
    /// class is one the engine uses for nothing urgent (the retention sweep's timer), since the threads keep the
    /// value: an unprivileged thread may raise its nice value but not lower it again.
    static let qos = DispatchQoS.utility
    /// The nice value reads run at.
    let nice: Int32

    init(queues count: Int) {
        nice = min(19, currentThreadNice() + ReadPool.niceIncrement)
        queues = (0..<max(1, count)).map { DispatchQueue(label: "jobserver.read.\($0)", qos: ReadPool.qos) }
        waiting = (0..<max(1, count)).map { _ in Counter() }
    }

    func async(_ work: @escaping @Sendable () -> Void) {
        var best = 0
        var least = Int.max
        for k in waiting.indices {
            let n = waiting[k].value.load(ordering: .relaxed)
            if n < least {
                least = n
                best = k
                if n == 0 { break }
            }
        }
        let counter = waiting[best]
        counter.value.add(1, ordering: .relaxed)
        let nice = self.nice
        queues[best].async {
            lowerCurrentThreadPriority(to: nice)
            work()
            counter.value.subtract(1, ordering: .relaxed)
        }
    }
}

/// A settled job's answer to a read, made once: it changes no more (until the job is deleted).
public struct SettledJob: Sendable {
    public let id: String
    public let version: Int64
    /// The answer's one copy, which every reader of it shares.
    public let answer: SettledAnswer
    /// The answer's body: all of it, or its first bytes when `answer.pieces` has more.
    public var body: [UInt8] { answer.bytes }

    public init(id: String, version: Int64, body: [UInt8]) {
        self.init(id: id, version: version, answer: SettledAnswer(body))
    }

    init(id: String, version: Int64, answer: SettledAnswer) {
        self.id = id
        self.version = version
        self.answer = answer
    }
}

/// A settled job's answer bytes, as an object: a reader that sends them holds it for as long as it holds the bytes
/// (`HTTPResponse.bodyOwner`), so that the settled-job cache sees when no reader needs an answer too large to keep.
/// A very large one is kept in a temporary file instead (`file`, with `bytes` empty), sent from there.
public final class SettledAnswer: Sendable {
    /// The answer's bytes, or its first bytes when `pieces` has more.
    public let bytes: [UInt8]
    /// The rest of the answer after `bytes`, in order: the arrays it was written in (`AnswerSink.append(shared:)`),
    /// sent as they are rather than copied into one. Empty for most answers.
    public let pieces: [[UInt8]]
    public let file: SpooledAnswer?
    /// The answer's length, wherever it is kept.
    public let count: Int

    public convenience init(_ bytes: [UInt8]) {
        self.init(bytes, pieces: [])
    }

    init(_ bytes: [UInt8], pieces: [[UInt8]]) {
        self.bytes = bytes
        self.pieces = pieces
        self.file = nil
        self.count = pieces.reduce(bytes.count) { $0 + $1.count }
    }

    init(file: SpooledAnswer) {
        self.bytes = []
        self.pieces = []
        self.file = file
        self.count = file.count
    }

    /// All of the answer's bytes in one array, from its pieces or its file (tests).
    public func allBytes() throws -> [UInt8] {
        if let file { return try file.bytes() }
        return bytes + pieces.joined()
    }
}

/// What `Engine.readJob` found.
public enum JobRead: Sendable {
    case notFound
    /// A job not (or not yet known to be) settled, as it is now.
    case record(JobRecord)
    /// A settled job's answer.
    case settled(SettledJob)
    /// The job is at a version the reader said it knows; nothing else of it was read.
    case unchanged(version: Int64)
}

/// What `Engine.nodeList` found.
public enum NodeListRead: Sendable {
    case notFound
    /// The nodes (in tree order), of a job still running or asked for without results.
    case nodes([NodeRecord])
    /// A settled job's nodes with their results, shown.
    case shown(SettledAnswer)
}

/// What `Engine.node` found.
public enum NodeLookup: Sendable {
    case found(NodeRecord)
    case noSuchNode
    case noSuchJob
}

/// Settled jobs' answers by id, bounded by their bytes, oldest entry evicted first. An answer too large to keep is
/// still found here while some reader holds it: readers of a large job at once share one copy of its answer rather
/// than each making and holding their own.
final class SettledJobCache: @unchecked Sendable {
    // @unchecked: every stored property but the constants is read and written only with `lock` held.
    let capacityBytes: Int
    /// Bytes counted for an entry beyond its body and id: the dictionary slot, the order slot, the headers.
    static let overheadBytes = 96
    private let lock = Lock()
    private var entries: [String: SettledJob] = [:]
    /// Ids in insertion order from `head` on; an id may be stale (removed, or inserted again later).
    private var order: [String] = []
    private var head = 0
    private var totalBytes = 0
    private var removalCount: UInt64 = 0
    /// Answers too large to keep, with their versions, held by their readers only.
    private var held = WeakAnswers<Int64>()
    /// Settled jobs' node lists with results, never kept, found like `held` while a reader holds one.
    private var heldNodeLists = WeakAnswers<Void>()

    /// Answers by job id that only their readers hold, each with what a lookup gives besides (`Extra`): one is found
    /// while a reader holds it; an entry whose answer is gone is dropped when met, and every such one when another
    /// is noted, so the entries stay as few as the answers being sent.
    private struct WeakAnswers<Extra> {
        private struct Entry {
            let extra: Extra
            weak var answer: SettledAnswer?
        }

        private var entries: [String: Entry] = [:]

        mutating func find(_ id: String) -> (extra: Extra, answer: SettledAnswer)? {
            guard let entry = entries[id] else { return nil }
            guard let answer = entry.answer else {
                entries[id] = nil
                return nil
            }
            return (entry.extra, answer)
        }

        mutating func note(_ answer: SettledAnswer, _ extra: Extra, for id: String) {
            entries = entries.filter { $0.value.answer != nil }
            entries[id] = Entry(extra: extra, answer: answer)
        }

        mutating func remove(_ id: String) { entries[id] = nil }

        mutating func removeAll() { entries.removeAll() }
    }

    init(capacityBytes: Int) { self.capacityBytes = max(0, capacityBytes) }

    static func size(of job: SettledJob) -> Int { job.answer.count + job.id.utf8.count + overheadBytes }

    subscript(id: String) -> SettledJob? {
        lock.withLock {
            if let kept = entries[id] { return kept }
            return held.find(id).map { SettledJob(id: id, version: $0.extra, answer: $0.answer) }
        }
    }

    /// The node list with results of the job, while a reader holds it.
    func nodeList(of id: String) -> SettledAnswer? {
        lock.withLock { heldNodeLists.find(id)?.answer }
    }

    /// Notes the node list with results `shown` of the job, found while a reader holds it, unless something was
    /// removed since `removals` was read.
    func noteNodeList(_ shown: SettledAnswer, of id: String, ifNoRemovalSince removals: UInt64) {
        lock.withLock {
            guard removalCount == removals else { return }
            heldNodeLists.note(shown, (), for: id)
        }
    }

    /// How many removals there were so far: pass to `insert(_:ifNoRemovalSince:)`.
    var removals: UInt64 { lock.withLock { removalCount } }

    /// What the entries count, never above `capacityBytes`.
    var bytes: Int { lock.withLock { totalBytes } }

    var count: Int { lock.withLock { entries.count } }

    /// Keeps `job` unless something was removed since `removals` was read (it may have been this job, read before
    /// it was deleted); evicts the oldest entries to make room. An answer larger than an eighth of the bound is not
    /// kept but only noted, and found again while a reader holds it.
    func insert(_ job: SettledJob, ifNoRemovalSince removals: UInt64) {
        let size = Self.size(of: job)
        guard size <= capacityBytes / 8 else {
            lock.withLock {
                guard removalCount == removals else { return }
                held.note(job.answer, job.version, for: job.id)
            }
            return
        }
        lock.withLock {
            guard removalCount == removals, entries[job.id] == nil else { return }
            while totalBytes + size > capacityBytes, head < order.count {
                let id = order[head]
                head += 1
                if let evicted = entries.removeValue(forKey: id) { totalBytes -= Self.size(of: evicted) }
            }
            entries[job.id] = job
            totalBytes += size
            order.append(job.id)
            compactOrder()
        }
    }

    func remove(_ id: String) {
        lock.withLock {
            removalCount &+= 1
            held.remove(id)
            heldNodeLists.remove(id)
            if let removed = entries.removeValue(forKey: id) { totalBytes -= Self.size(of: removed) }
            compactOrder()
        }
    }

    func removeAll() {
        lock.withLock {
            removalCount &+= 1
            held.removeAll()
            heldNodeLists.removeAll()
            entries.removeAll()
            order.removeAll()
            head = 0
            totalBytes = 0
        }
    }

    /// Drops evicted and stale ids from `order` once they are the larger part of it, so it stays within a small
    /// multiple of the entries. With `lock` held.
    private func compactOrder() {
        guard order.count > 64, order.count > 2 * entries.count else { return }
        var seen: Set<String> = []
        seen.reserveCapacity(entries.count)
        var kept: [String] = []
        kept.reserveCapacity(entries.count)
        // From the newest: an id inserted again keeps its latest place.
        for id in order[head...].reversed() where entries[id] != nil && seen.insert(id).inserted { kept.append(id) }
        order = kept.reversed()
        head = 0
    }
}

extension JobRecord {
    /// The job failed alone, with kind `internal`, because its stored form could not be loaded or rebuilt.
    func failedWhenLoaded(_ reason: String, at now: Int64) -> JobRecord {
        var record = self
        record.state = .failed
        record.finishedAt = now
        record.result = nil
        record.error = NodeError(.internal, reason, node: "root")
        record.version += 1
        return record
    }
}
