import Foundation

/// One job being run: its graph turned into a tree of Deferreds.
///
/// A fetch node is a Deferred whose canceller aborts its transfer; a list
/// node is a `DeferredList` over its children; a sequence chains its
/// children one after another; `timeout_ms` and `recover` are links on a
/// node's Deferred, and a last link records the settled state. Everything
/// here runs on the engine's queue.
final class JobRun: @unchecked Sendable {
    // @unchecked: every mutable property is touched only on the engine's `queue` (see above); the run is shared
    // with other threads only as a reference handed back to that queue.
    unowned let engine: Engine
    /// Grows when a map expands (its copies are appended).
    var graph: JobGraph
    var record: JobRecord
    var nodes: [NodeRecord]
    /// The Deferred of each started node (or the stand-in of a child waiting for a list's concurrency slot).
    var deferreds: [Deferred?]
    /// Transfers in flight, by node.
    var transfers: [Int: FetchHandle] = [:]
    /// What drives a running list with `concurrency` or a running sequence, by node; dropped when the node settles.
    var runners: [Int: AnyObject] = [:]
    /// Fetch nodes that were in flight, not idempotent, when the server stopped.
    var interrupted: Set<Int> = []
    /// Attempts made before a restart, by node.
    var priorAttempts: [Int: Int] = [:]
    var cancelRequested = false
    var deadlineExpired = false
    /// Set at shutdown: nothing more is recorded, so the job resumes on the next start.
    var stopping = false
    /// Started before its job's creation committed (`Engine.startsBeforeCommit`): it hands the store nothing, and
    /// requests from outside do not find it (`Engine.visibleRun`), until the commit does, or it is dropped unwritten.
    var provisional = false
    var deadlineTimer: Cancellable?
    var unsettledNodes: Int
    var dirtyNodes: Set<Int> = []
    var dirtyJob = false
    var pendingBodies: [(jobID: String, nodeID: String, body: StoredBody)] = []
    /// Whether it changed since its changes were last handed to the store (`Engine.flushDirty` clears all three).
    var hasUnwrittenChanges: Bool { dirtyJob || !dirtyNodes.isEmpty || !pendingBodies.isEmpty }
    /// The nodes this run holds of `Engine.nodeRoom`, given back when the engine forgets it.
    var roomHeld = 0
    /// Node changes handed to the store since it was last asked to write them at once (`Engine.flushDirty`).
    var changesHeld = 0
    /// Requests built from references when their node started, until their transfer begins (API.md §6.2).
    var resolvedRequests: [Int: FetchRequest] = [:]
    /// The job's response byte budget (`--max-job-bytes`), made when first asked for; `nil`: none.
    lazy var byteBudget: ByteBudget? = makeByteBudget()
    /// The last fetch's host key (`hostKey(of:)`).
    private var lastHostKey = ""
    /// The root list's results written as text for a waiter's answer, once one waits (`writeAnswerTexts`).
    var answerTexts: AnswerTexts?
    /// The texts would not have fitted under their bound: the answer is made from the values.
    var answerTextsGivenUp = false

    init(engine: Engine, graph: JobGraph, record: JobRecord, nodes: [NodeRecord]) {
        self.engine = engine
        self.graph = graph
        self.record = record
        // The submitted request is stored with the job's creation and never written again (updates leave it, and
        // reads do not show it): the run keeps its graph instead, not the JSON it was parsed from, which for a
        // job of 100,000 fetches is 14 MB more. Only its `notify` URL is kept: reads of a live job show the
        // delivery pending from it (`JobRecord.notifyURL`).
        self.record.request = record.notifyURL.map { .object(["notify": .object(["url": .string($0)])]) } ?? .null
        self.nodes = nodes
        self.deferreds = Array(repeating: nil, count: graph.nodes.count)
        // Counted in place: `filter` copied every unsettled record into an array of its own, 100,000 of them for a
        // new job of 100,000 fetches, only to count them.
        var unsettled = 0
        for i in nodes.indices where !nodes[i].state.isSettled { unsettled += 1 }
        self.unsettledNodes = unsettled
    }

    var id: String { record.id }

    /// Node `i` as reads show it: a running node's `elapsedMs` is the time so far.
    func nodeSnapshot(_ i: Int, includeResult: Bool = true, nowMs: Int64 = Timestamp.nowMs()) -> NodeRecord {
        var node = nodes[i]
        if !includeResult { node.result = nil }
        if node.state == .running, let started = node.startedAt { node.elapsedMs = Int(max(0, nowMs - started)) }
        return node
    }

    /// Every node as reads show it, in tree order.
    func nodeSnapshots(includeResults: Bool) -> [NodeRecord] {
        let now = Timestamp.nowMs()
        return nodes.indices.map { nodeSnapshot($0, includeResult: includeResults, nowMs: now) }
    }

    // MARK: - Starting

    /// Starts the job: its deadline, then its root.
    func begin() {
        if let deadline = record.deadlineMs, !record.state.isSettled {
            // A job that waited for its `not_before`, or runs again after a retry, has its whole deadline from then.
            let since = max(record.createdAt, record.notBefore ?? 0, record.retriedAt ?? 0)
            let elapsed = max(0, Timestamp.nowMs() - since)
            let remaining = max(0, Int64(deadline) - elapsed)
            deadlineTimer = engine.scheduler.schedule(afterMilliseconds: Int(remaining)) { [weak self] in
                self?.deadlinePassed()
            }
        }
        if !record.state.isSettled { engine.memoryReturn.runBegan(id, nodes: nodes.count) }
        let root = start(0)
        if record.state.isSettled == false, nodes[0].state.isSettled {
            // Settled root restored from the store: the job only missed its last write.
            finishJob(fromRootResult: root.result)
        }
    }

    /// Starts node `i` and returns its Deferred. A node restored already settled comes back as a fired Deferred.
    @discardableResult
    func start(_ i: Int) -> Deferred {
        if nodes[i].state.isSettled { return restoredDeferred(i) }
        let node = graph.nodes[i]
        let inner: Deferred
        var recover = node.recover
        if interrupted.contains(i) {
            inner = Deferred.withError(
                NodeError(.interrupted, "\(methodAndURL(i)) was in flight when the server stopped", node: node.id))
        } else if let failure = resolveExpressions(i, recover: &recover) {
            inner = Deferred.withError(failure)
        } else {
            switch node.kind {
            case .fetch(let request): inner = startFetch(i, resolvedRequests[i] ?? request)
            case .list(let options): inner = startList(i, options)
            case .sequence(let options): inner = startSequence(i, options)
            case .map(let spec): inner = startMap(i, spec)
            }
        }
        deferreds[i] = inner
        if let path = node.dataflow?.select { inner.then(JobRun.selecting(path, node: node.id)) }
        if let timeout = node.timeoutMs {
            let nodeID = node.id
            inner.timeout(afterMilliseconds: timeout, scheduler: engine.scheduler) {
                NodeError(.timeout, "node \(nodeID) did not settle within \(timeout) ms", node: nodeID)
            }
        }
        if let value = recover {
            inner.fail { [unowned self] failure in
                if JobRun.isCancellation(failure) { return failure }
                self.nodes[i].recovered = true
                return value
            }
        }
        inner.both { [unowned self] result in
            self.settle(i, with: result)
            return result
        }
        return inner
    }

    private func restoredDeferred(_ i: Int) -> Deferred {
        let n = nodes[i]
        switch n.state {
        case .succeeded:
            return Deferred.withResult(n.result ?? .null)
        case .cancelled:
            return Deferred.withError(n.error ?? NodeError(.cancelled, "cancelled", node: n.id))
        default:
            return Deferred.withError(n.error ?? NodeError(.internal, "node \(n.id) ended \(n.state.rawValue)", node: n.id))
        }
    }

    func markRunning(_ i: Int) {
        guard !stopping, nodes[i].state == .pending else { return }
        // A node running again after a restart keeps the time it first started.
        if nodes[i].startedAt == nil { nodes[i].startedAt = Timestamp.nowMs() }
        changeState(i, to: .running)
    }

    // MARK: - fetch

    private func startFetch(_ i: Int, _ request: FetchRequest) -> Deferred {
        let d = Deferred(canceller: { [unowned self] d in
            if let handle = self.transfers.removeValue(forKey: i) { handle.cancel() }
            self.leaveTransferLayer(i)
            if !d.isCalled { _ = try? d.takeError(Failure.cancellation()) }
        })
        if request.cache == .use, let cache = engine.httpCache {
            lookUpCache(i, request, cache)
            return d
        }
        engine.enqueueFetch(run: self, node: i, host: hostKey(of: request.url))
        return d
    }

    /// `FetchQueue.hostKey(of: url)`, the last one again when `url` begins with it: a list's fetches mostly go to
    /// one host, and working out the key was a third of queueing each (about 6 ms of starting a list of 10,000, in a
    /// profile).
    func hostKey(of url: String) -> String {
        if !FetchQueue.url(url, hasHostKey: lastHostKey) { lastHostKey = FetchQueue.hostKey(of: url) }
        return lastHostKey
    }

    /// Called by the engine when the fetch queue gives node `i` a transfer slot; false if it is no longer wanted.
    func beginTransfer(_ i: Int, host: String) -> Bool {
        guard !stopping, let d = deferreds[i], !d.isCalled, case .fetch(let written) = graph.nodes[i].kind else {
            return false
        }
        var request = resolvedRequests.removeValue(forKey: i) ?? written
        let paginate = graph.nodes[i].dataflow?.paginate
        if let paginate { request = PageWalk.firstRequest(request, paginate) }
        nodes[i].request = RequestRecord.json(request, keepBody: graph.nodes[i].dataflow?.buildsBody == true)
        markRunning(i)
        if let paginate {
            beginPaging(i, request, paginate, host: host)
            return true
        }
        let prior = priorAttempts[i] ?? 0
        let engine = self.engine
        if request.cache == .use, let cache = engine.httpCache {
            beginCachedTransfer(i, request, host: host, cache: cache)
            return true
        }
        if request.coalesce {
            beginSharedTransfer(i, request, host: host)
            return true
        }
        // The first attempt begins with the transfer: counted here, in the same write as the running state, rather
        // than by a hop back from the fetcher's thread, which only retries make.
        attemptStarted(i, attempt: prior + 1)
        transfers[i] = engine.fetcher.start(
            request,
            timeoutMs: nil,
            budget: byteBudget,
            onAttempt: { [weak self] attempt in
                guard attempt > 1, let run = self else { return }
                engine.queue.async { run.attemptStarted(i, attempt: prior + attempt) }
            },
            completion: { [weak self] outcome in
                let run = self
                engine.fetchEnded(slotOf: host) { run?.fetchFinished(i, outcome) }
            })
        return true
    }

    private func attemptStarted(_ i: Int, attempt: Int) {
        guard !stopping, !nodes[i].state.isSettled, nodes[i].attempts != attempt else { return }
        nodes[i].attempts = attempt
        touch(i)
    }

    func fetchFinished(_ i: Int, _ outcome: FetchOutcome) {
        transfers[i] = nil
        guard !stopping, let d = deferreds[i], !d.isCalled else { return }
        let outcome = chargeDelivered(i, outcome)
        let nodeID = graph.nodes[i].id
        nodes[i].attempts = (priorAttempts[i] ?? 0) + outcome.attempts
        if let response = outcome.lastResponse {
            nodes[i].status = response.status
            pendingBodies.append((id, nodeID, StoredBody(contentType: response.contentType, bytes: response.rawBody)))
        }
        switch outcome.result {
        case .success(let response):
            let json = response.json(headers: engine.headerObjects.object(response.headers))
            _ = try? d.takeResult(json)
            // Settled by now (the chain runs at once): its result may be stored without the body it repeats.
            markBodyResult(i, response, json: json, stored: outcome.lastResponse)
        case .failure(var error):
            error.node = nodeID
            _ = try? d.takeError(error)
        }
    }

    private func methodAndURL(_ i: Int) -> String {
        guard case .fetch(let request) = graph.nodes[i].kind else { return graph.nodes[i].id }
        return "\(request.method) \(nodes[i].request?["url"]?.stringValue ?? request.url)"
    }

    // MARK: - list

    /// How many children a list starts between two hand-overs of queued fetches to the fetcher.
    static let childrenPerPump = 64

    /// Starts `children` in order, handing the fetches queued so far to the fetcher after every `childrenPerPump`
    /// of them rather than once all have started, in the slots of those begun before them that have ended
    /// (`Engine.pumpFetchesMidTurn`): starting 10,000 took 40–60 ms, in which no transfer began.
    private func startEach(_ children: [Int]) -> [Deferred] {
        var started: [Deferred] = []
        started.reserveCapacity(children.count)
        for child in children {
            started.append(start(child))
            if started.count % Self.childrenPerPump == 0 { engine.pumpFetchesMidTurn() }
        }
        return started
    }

    private func startList(_ i: Int, _ options: ListOptions) -> Deferred {
        markRunning(i)
        let children = graph.nodes[i].children
        let childDeferreds: [Deferred]
        if let limit = options.concurrency, limit < children.count {
            let window = ListWindow(run: self, children: children, limit: limit)
            runners[i] = window
            childDeferreds = window.placeholders
        } else {
            childDeferreds = startEach(children)
        }
        return combine(children, childDeferreds, options: options, id: graph.nodes[i].id, noun: "children")
    }

    /// The `DeferredList` of `childDeferreds`, which stand for nodes `children` (a list's, or a map's copies): its
    /// result is their entries, or with `fire_on_first_result` the first result, or if none came the error that
    /// all `noun` of node `id` failed. With `cancel_remaining`, once it fired early it cancels those not settled.
    func combine(_ children: [Int], _ childDeferreds: [Deferred], options: ListOptions, id: String, noun: String) -> Deferred {
        let list = DeferredList(
            childDeferreds, fireOnFirstResult: options.fireOnFirstResult, fireOnFirstError: options.fireOnFirstError)
        list.cancelDeferredsWhenCancelled()
        list.then { [unowned self] result in
            guard let entries = result as? [Any?] else { return result }  // the first child's result
            if options.fireOnFirstResult {
                // No child succeeded: every entry is a failure.
                let errors = zip(children, entries).map { self.childError($1, child: $0) }
                return Failure(NodeError(.allFailed, "all \(children.count) \(noun) of \(id) failed", node: id, errors: errors))
            }
            return JSONValue.array(zip(children, entries).map { self.entry($1, child: $0, consumeErrors: options.consumeErrors) })
        }
        if options.cancelRemaining, options.fireOnFirstResult || options.fireOnFirstError {
            list.both { [unowned self] result in
                self.cancelUnsettled(children, childDeferreds)
                return result
            }
        }
        return list
    }

    /// Cancels those of `childDeferreds` whose node in `children` has not settled: the rest of a list that fired
    /// early, or of a map's copies.
    func cancelUnsettled(_ children: [Int], _ childDeferreds: [Deferred]) {
        guard !stopping else { return }
        for (k, child) in children.enumerated() where !nodes[child].state.isSettled { childDeferreds[k].cancel() }
    }

    /// A child's place in a results array: its result, or `{"error": …}` (`null` when errors are consumed).
    func entry(_ value: Any?, child: Int, consumeErrors: Bool) -> JSONValue {
        if let failure = Failure.from(value) {
            return consumeErrors ? .null : .object(["error": JobRun.nodeError(failure, node: graph.nodes[child].id).json])
        }
        return (value as? JSONValue) ?? .null
    }

    func childError(_ value: Any?, child: Int) -> NodeError {
        if let failure = Failure.from(value) { return JobRun.nodeError(failure, node: graph.nodes[child].id) }
        return NodeError(.internal, "child \(graph.nodes[child].id) did not fail", node: graph.nodes[child].id)
    }

    // MARK: - sequence

    private func startSequence(_ i: Int, _ options: SequenceOptions) -> Deferred {
        markRunning(i)
        let sequence = SequenceRun(run: self, children: graph.nodes[i].children, continueOnError: options.continueOnError)
        runners[i] = sequence
        return sequence.deferred
    }

    /// Ends every unstarted node of the subtree of `i` in `state` (`cancelled` or `skipped`).
    func endUnstarted(_ i: Int, as state: NodeState) {
        guard !stopping else { return }
        for j in i..<graph.descendants(of: i).upperBound where !nodes[j].state.isSettled && deferreds[j] == nil {
            nodes[j].finishedAt = Timestamp.nowMs()
            if state == .cancelled { nodes[j].error = NodeError(.cancelled, "cancelled before it started", node: nodes[j].id) }
            changeState(j, to: state)
        }
    }

    // MARK: - settling

    private func settle(_ i: Int, with result: Any?) {
        deferreds[i] = nil
        runners[i] = nil
        guard !stopping, !nodes[i].state.isSettled else { return }
        let now = Timestamp.nowMs()
        let state: NodeState
        if let failure = Failure.from(result) {
            var error = JobRun.nodeError(failure, node: nodes[i].id)
            if i == 0, deadlineExpired, error.kind == .cancelled {
                error = NodeError(.timeout, "job deadline of \(record.deadlineMs ?? 0) ms passed", node: nodes[i].id)
            }
            if error.kind == .cancelled, i == 0, cancelRequested { error.message = "job cancelled" }
            state = error.kind == .cancelled ? .cancelled : .failed
            nodes[i].error = error
            nodes[i].result = nil
            nodes[i].resultSource = nil
        } else {
            state = .succeeded
            let value = (result as? JSONValue) ?? .null
            nodes[i].result = value
            nodes[i].resultSource = storedResultSource(i, result: value)
            nodes[i].error = nil
            if answerTexts != nil { writeAnswerText(i, value) }
        }
        nodes[i].finishedAt = now
        if let started = nodes[i].startedAt { nodes[i].elapsedMs = Int(now - started) }
        changeState(i, to: state)
        if i == 0 { finishJob(fromRootResult: result) }
    }

    private func finishJob(fromRootResult result: Any?) {
        deadlineTimer?.cancel()
        deadlineTimer = nil
        record.state = nodes[0].state
        record.finishedAt = nodes[0].finishedAt ?? Timestamp.nowMs()
        record.result = nodes[0].state == .succeeded ? nodes[0].result : nil
        record.resultSource = record.result == nil ? nil : .child(0)
        record.error = nodes[0].state == .succeeded ? nil : nodes[0].error
        dirtyJob = true
        engine.jobStateChanged(self)
    }

    private func changeState(_ i: Int, to state: NodeState) {
        let old = nodes[i].state
        guard old != state else { return }
        nodes[i].state = state
        record.progress[old] -= 1
        record.progress[state] += 1
        engine.nodeStateChanged(from: old, to: state)
        if state.isSettled && !old.isSettled { unsettledNodes -= 1 }
        if i == 0 {
            record.state = state
            if state == .running { record.startedAt = nodes[0].startedAt }
            if !state.isSettled { engine.jobStateChanged(self) }
        }
        touch(i)
    }

    /// Records a change of node `i`: a new version, written with the next batch.
    func touch(_ i: Int) {
        record.version += 1
        dirtyNodes.insert(i)
        dirtyJob = true
        engine.markDirty(self)
    }

    // MARK: - cancelling

    /// Cancels every unsettled node (API.md §1.3).
    func cancel() {
        guard !record.state.isSettled else { return }
        cancelRequested = true
        if let root = deferreds[0] {
            root.cancel()
        } else {
            // Never begun (waiting for its time or its concurrency key): nothing runs, the job ends here.
            endUnstarted(0, as: .cancelled)
            if nodes[0].state == .cancelled, !stopping {
                nodes[0].error = NodeError(.cancelled, "job cancelled", node: nodes[0].id)
                finishJob(fromRootResult: nil)
            }
        }
    }

    private func deadlinePassed() {
        deadlineTimer = nil
        guard !record.state.isSettled, !stopping else { return }
        deadlineExpired = true
        if let root = deferreds[0] { root.cancel() }
    }

    /// Stops recording anything: the server is going down, or the job is being deleted.
    func stop() {
        stopping = true
        deadlineTimer?.cancel()
        deadlineTimer = nil
        for handle in transfers.values { handle.cancel() }
        transfers.removeAll()
        leaveTransferLayer()
        // Nothing fires the nodes' Deferreds after this: their links go, and with them the cycles of a list (or a
        // list window) and the children that never settled, which would otherwise outlive the run.
        for deferred in deferreds { deferred?.abandon() }
        for case let runner as MapRunner in runners.values { runner.abandon() }
    }

    static func isCancellation(_ failure: Failure) -> Bool {
        failure.isCancellation || (failure.error as? NodeError)?.kind == .cancelled
    }

    static func nodeError(_ failure: Failure, node: String) -> NodeError {
        if var error = failure.error as? NodeError {
            if error.node == nil { error.node = node }
            return error
        }
        if failure.isCancellation { return NodeError(.cancelled, "cancelled", node: node) }
        return NodeError(.internal, String(describing: failure.error), node: node)
    }
}

extension NodeRecord {
    /// Ends a node that will never run (again) as `cancelled`, saying why; a running one keeps the time it ran.
    mutating func settleAsLeftover(reason: String, nowMs: Int64) {
        if state == .running, let started = startedAt { elapsedMs = Int(max(0, nowMs - started)) }
        state = .cancelled
        finishedAt = nowMs
        result = nil
        resultSource = nil
        error = NodeError(.cancelled, reason, node: id)
    }
}

/// A canceller that hands the cancellation to `owner` while it lives; once it is gone there is nothing left to
/// stop, and the Deferred just fails with the cancellation.
func forwardingCanceller<Owner: AnyObject>(
    to owner: Owner, _ cancel: @escaping (Owner, Deferred) -> Void
) -> (Deferred) -> Void {
    { [weak owner] d in
        if let owner {
            cancel(owner, d)
        } else if !d.isCalled {
            _ = try? d.takeError(Failure.cancellation())
        }
    }
}

/// Children that stand in their list as placeholder Deferreds until they are started, in order, by a subclass
/// (`ListWindow`, `StaggeredStart`): a placeholder takes its child's result once the child settles, and
/// cancelling it cancels the child, or ends a child not yet started as cancelled. Used on the engine's queue.
class StandIns {
    unowned let run: JobRun
    let children: [Int]
    private(set) var placeholders: [Deferred] = []
    private var started: [Int: Deferred] = [:]
    /// The next child to start.
    private(set) var next = 0

    init(run: JobRun, children: [Int]) {
        self.run = run
        self.children = children
        placeholders = children.indices.map { k in
            Deferred(canceller: forwardingCanceller(to: self) { $0.cancelChild(k, $1) })
        }
        // The placeholders' cancellers hold these weakly: the owner keeps them (the run's `runners`, a map's runner),
        // and so does each started child's callback until the child settles.
        for (k, child) in children.enumerated() { run.deferreds[child] = placeholders[k] }
    }

    private func cancelChild(_ k: Int, _ placeholder: Deferred) {
        if let child = started[k] {
            child.cancel()
        } else if k >= next {
            run.deferreds[children[k]] = nil
            run.endUnstarted(children[k], as: .cancelled)
        }
        if !placeholder.isCalled { _ = try? placeholder.takeError(Failure.cancellation()) }
    }

    /// Starts the next child, unless its placeholder was cancelled before (then it is passed over); calls
    /// `childStarting` first, and once it settled (at once, if it settles as it starts) `childSettling`, then its
    /// placeholder takes its result, then `childSettled`.
    func startNext() {
        let k = next
        next += 1
        let placeholder = placeholders[k]
        if placeholder.isCalled { return }  // cancelled before it started
        childStarting()
        run.deferreds[children[k]] = nil
        let child = run.start(children[k])
        started[k] = child
        child.both { [self] result in
            self.childSettling()
            self.started[k] = nil
            if !placeholder.isCalled {
                if let failure = Failure.from(result) {
                    _ = try? placeholder.takeError(failure)
                } else {
                    _ = try? placeholder.takeResult(result)
                }
            }
            self.childSettled()
            return result
        }
    }

    /// Before a child starts.
    func childStarting() {}

    /// When a child settled, before its placeholder takes its result.
    func childSettling() {}

    /// After a child settled and its placeholder took its result.
    func childSettled() {}
}

/// A list with `concurrency`: children wait behind their stand-ins until a slot frees.
final class ListWindow: StandIns {
    let limit: Int
    private var running = 0
    private var pumping = false

    init(run: JobRun, children: [Int], limit: Int) {
        self.limit = limit
        super.init(run: run, children: children)
        pump()
    }

    override func childStarting() { running += 1 }

    override func childSettling() { running -= 1 }

    override func childSettled() { pump() }

    private func pump() {
        guard !pumping else { return }
        pumping = true
        defer { pumping = false }
        while running < limit, next < children.count { startNext() }
    }
}

/// A sequence: child n+1 starts after child n settled.
private final class SequenceRun {
    unowned let run: JobRun
    let children: [Int]
    let continueOnError: Bool
    private(set) lazy var deferred = Deferred(canceller: forwardingCanceller(to: self) { $0.cancel($1) })
    var results: [JSONValue] = []
    var index = 0
    var waiting = false
    var pumping = false
    var cancelling = false
    var current: Deferred?

    init(run: JobRun, children: [Int], continueOnError: Bool) {
        self.run = run
        self.children = children
        self.continueOnError = continueOnError
        pump()
    }

    private func cancel(_ d: Deferred) {
        cancelling = true
        current?.cancel()
        for k in index..<children.count { run.endUnstarted(children[k], as: .cancelled) }
        index = children.count
        if !d.isCalled { _ = try? d.takeError(Failure.cancellation()) }
    }

    private func pump() {
        guard !pumping else { return }
        pumping = true
        defer { pumping = false }
        while !cancelling, !deferred.isCalled, !waiting {
            if index >= children.count {
                _ = try? deferred.takeResult(JSONValue.array(results))
                return
            }
            waiting = true
            let child = run.start(children[index])
            current = child
            child.both { [self] result in
                self.waiting = false
                self.current = nil
                self.childSettled(result)
                self.pump()
                return result
            }
        }
    }

    private func childSettled(_ result: Any?) {
        guard !cancelling, !deferred.isCalled else { return }
        let child = children[index]
        index += 1
        if let failure = Failure.from(result), !continueOnError {
            for k in index..<children.count { run.endUnstarted(children[k], as: .skipped) }
            index = children.count
            _ = try? deferred.takeError(failure)
            return
        }
        results.append(run.entry(result, child: child, consumeErrors: false))
    }
}
