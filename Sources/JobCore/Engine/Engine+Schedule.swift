import Foundation

// API.md §8: jobs that wait for a time (`not_before`), for a slot of their concurrency key, and jobs run again
// (`retry`).
//
// A job with a future `not_before` is not in memory while it waits: it is a row with `due_at` set, and one timer
// is armed for the earliest `due_at`. When it fires, the due jobs are read in batches, rebuilt and begun, and their
// rows written with `due_at` cleared, so that no later read takes them again. Everything that moves a job between
// the store and memory this way (taking due jobs in, cancelling a waiting one, retrying one) runs on the
// timekeeper's serial queue, so two of them never race for the same job.

/// The timer for the jobs waiting in the store for their `not_before`.
final class Timekeeper: @unchecked Sendable {
    // @unchecked: `engine` is set once in `Engine.init`, before the engine is shared; `timer`, `armedAt` and
    // `stopped` are only touched on `queue`; `scheduledJobs` only on the engine's queue.
    weak var engine: Engine?
    let queue = DispatchQueue(label: "jobserver.timekeeper")
    private var timer: DispatchSourceTimer?
    /// The `due_at` the timer is armed for.
    private var armedAt: Int64?
    private var stopped = false
    /// Jobs waiting in the store for their time (owned by the engine's queue).
    var scheduledJobs = 0
    /// Jobs taken in whose rows without `due_at` may not be committed yet, with the pass that took them: a read
    /// may still return them, and they are skipped. On `queue`.
    private var taken: [String: Int] = [:]
    /// Passes so far, and the last one whose rows are known to be committed (set from the store's flush callback).
    private var passes = 0
    private var committedPass = 0

    /// Counts the waiting jobs and takes in those already due (a restart after their time).
    func start() throws {
        guard let engine else { return }
        let count = try engine.store.scheduledJobCount()
        engine.queue.sync { scheduledJobs = count }
        queue.sync {
            let timer = DispatchSource.makeTimerSource(queue: queue)
            timer.setEventHandler { [weak self] in self?.pass() }
            timer.schedule(deadline: .distantFuture)
            timer.resume()
            self.timer = timer
        }
        queue.async { self.pass() }
    }

    func stop() {
        queue.async {
            self.stopped = true
            self.timer?.cancel()
            self.timer = nil
        }
    }

    /// A job was stored to wait until `dueAt` (counted as waiting and as pending by the caller, on the engine's queue).
    func scheduled(dueAt: Int64) {
        queue.async {
            if let armed = self.armedAt, armed <= dueAt { return }
            self.arm(dueAt)
        }
    }

    /// On `queue`.
    private func arm(_ dueAt: Int64) {
        guard !stopped, let timer else { return }
        armedAt = dueAt
        let delay = max(0, dueAt - Timestamp.nowMs())
        timer.schedule(deadline: .now() + .milliseconds(Int(min(delay, 86_400_000))), leeway: .milliseconds(1))
    }

    /// Takes in every job due now, in batches, then arms the timer for the next; on `queue`.
    ///
    /// Nothing here waits for the store's writer: a job taken in is remembered (`taken`) until a flush that
    /// followed its pass has committed, and skipped if a read returns it meanwhile. Reads after such a commit no
    /// longer see it, since its row was queued without `due_at` before the flush.
    private func pass() {
        guard !stopped, let engine else { return }
        armedAt = nil
        if !taken.isEmpty {
            let committed = committedPass
            taken = taken.filter { $0.value > committed }
        }
        passes += 1
        let pass = passes
        let readAt = Timestamp.nowMs()
        do {
            let mark = engine.nodeRoom.markBeforeRead()
            let batch = max(1, engine.configuration.dueBatchSize)
            var after: (dueAt: Int64, id: String)?
            var tookAny = false
            // The jobs left in the store for room: the read stopped at the room's nodes, or a job found none.
            var roomFull = false
            var cut = false
            // Bounded: each round reads past the last row of the one before.
            for _ in 0..<100_000 {
                var unreadable: [UnreadableJob] = []
                let maxNodes = engine.nodeRoom.free
                let due = try engine.store.dueJobs(
                    atOrBeforeMs: readAt, after: after, limit: batch, maxNodes: maxNodes,
                    skipping: { taken[$0] != nil }, unreadable: &unreadable)
                let fresh = due.filter { taken[$0.job.id] == nil }
                let bad = unreadable.filter { taken[$0.job.id] == nil }
                cut = fresh.reduce(0) { $0 + $1.nodes.count } > maxNodes
                if !fresh.isEmpty || !bad.isEmpty {
                    guard let took = engine.takeDue(fresh, unreadable: bad) else { return }
                    for item in fresh.prefix(took) { taken[item.job.id] = pass }
                    for item in bad { taken[item.job.id] = pass }
                    tookAny = true
                    // The rest wait for room: `Engine.giveBack` brings the timekeeper back.
                    if took < fresh.count {
                        roomFull = true
                        break
                    }
                }
                if cut { break }
                let rows = due.map { ($0.job.dueAt ?? 0, $0.job.id) } + unreadable.map { ($0.job.dueAt ?? 0, $0.job.id) }
                guard rows.count >= batch, let last = rows.max(by: { $0 < $1 }) else { break }
                after = (last.0, last.1)
            }
            if tookAny {
                engine.store.flush { [weak self] _ in
                    guard let keeper = self else { return }
                    keeper.queue.async { keeper.committedPass = max(keeper.committedPass, pass) }
                }
            }
            if roomFull {
                if let next = try engine.store.nextDueAt(after: readAt) { arm(next) }
                return
            }
            // The read stopped at the room's nodes, and room came back meanwhile: another pass at once.
            if cut { return arm(Timestamp.nowMs()) }
            engine.nodeRoom.noneQueued(since: mark)
            // Whatever was due by `readAt` has been read; a job stored later with an earlier time arms the timer
            // itself (`scheduled`).
            if let next = try engine.store.nextDueAt(after: readAt) { arm(next) }
        } catch {
            engine.logger.error("jobs due to start could not be read", ["error": .string("\(error)")])
            arm(Timestamp.nowMs() + 1000)
        }
    }

    /// Cancels a job waiting in the store for its time; on the timekeeper's queue, so it is not taken in meanwhile.
    func cancelWaiting(id: String, _ completion: @escaping @Sendable (Result<CancelOutcome, Error>) -> Void) {
        queue.async {
            guard let engine = self.engine else { return completion(.failure(EngineError.shuttingDown("the server is shutting down"))) }
            do {
                if let live = engine.queue.sync(execute: { engine.cancelLive(id) }) {
                    return engine.answerAfterCommit(live, completion)
                }
                guard let job = try engine.store.job(id: id) else { return completion(.success(.notFound)) }
                if let settled = Engine.cancelOutcome(ofSettled: job) { return completion(.success(settled)) }
                guard job.dueAt != nil else {
                    return completion(.failure(EngineError.storage("job \(id) is not running on this server")))
                }
                let nodes = try engine.store.nodes(jobID: id, includeResults: true)
                let outcome = engine.queue.sync { engine.cancelStored(job, nodes) }
                engine.answerAfterCommit(outcome, completion)
            } catch {
                completion(.failure(error))
            }
        }
    }
}

extension Engine {
    // MARK: - Concurrency keys (on the queue)

    /// Begins the run, or puts it in its concurrency key's queue (`resumed`: it was running before a restart and
    /// takes a slot at once).
    func admit(_ run: JobRun, resumed: Bool) {
        guard let key = run.record.concurrencyKey, !run.record.state.isSettled else {
            run.begin()
            return
        }
        if let admission = keyAdmission {
            // Servers share the database: a job that was running holds its slot there already; any other
            // waits for the store to give it one (API.md §10).
            if resumed { return run.begin() }
            _ = gate.waitInStore(id: run.id, key: key)
            admission.requestKeyAdmission([key])
            return
        }
        if resumed {
            gate.resume(id: run.id, key: key)
            run.begin()
            return
        }
        gate.enqueue(id: run.id, key: key, limit: run.record.concurrencyLimit ?? 1)
        beginAdmitted(key)
    }

    /// Begins the waiting jobs of `key` that have a slot now.
    func beginAdmitted(_ key: String) {
        // Bounded: each round admits at least one job or ends.
        for _ in 0..<100_000 {
            let admitted = gate.admit(key: key)
            if admitted.isEmpty { return }
            for id in admitted {
                guard let run = runs[id], !run.record.state.isSettled, !run.stopping else {
                    gate.leave(id: id, key: key)
                    continue
                }
                run.begin()
                if run.hasUnwrittenChanges { markDirty(run) }
            }
            schedulePump()
        }
    }

    /// A settled job gives its slot (or its place in the queue) back; the next waiting ones start.
    func leaveGate(_ run: JobRun) {
        guard let key = run.record.concurrencyKey else { return }
        // Shared: the store takes the slot back once the settled state is committed (the writer asks for a pass).
        if keyAdmission != nil { return gate.leaveStore(id: run.id) }
        gate.leave(id: run.id, key: key)
        queue.async { if !self.shuttingDown { self.beginAdmitted(key) } }
    }

    /// The job as reads show it: with its place in its key's queue while it waits there.
    func shownRecord(_ run: JobRun) -> JobRecord {
        var record = run.record
        if record.state == .pending, let key = record.concurrencyKey {
            record.queuePosition = keyAdmission == nil ? gate.position(id: record.id, key: key) : gate.storePosition(id: record.id)
        }
        return record
    }

    // MARK: - Jobs waiting for their time

    /// Rebuilds and begins jobs the timekeeper read as due, in their order, while `nodeRoom` has room for them, and
    /// queues their rows without `due_at`; a job that cannot be rebuilt fails alone, with kind `internal`. The jobs
    /// of `due` taken (a prefix: the first that finds no room and those after it wait on in the store), or `nil`
    /// (and nothing taken) once shutdown began.
    func takeDue(_ due: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob]) -> Int? {
        queue.sync {
            if shuttingDown { return nil }
            var written: [JobRecord] = []
            var failed: [(JobRecord, String)] = unreadable.map { ($0.job, "the stored job could not be read: \($0.error.description)") }
            var taken = 0
            for (stored, nodes) in due {
                if runs[stored.id] == nil, !nodeRoom.take(forWaiting: nodes.count) { break }
                taken += 1
                timekeeper.scheduledJobs -= 1
                var job = stored
                job.dueAt = nil
                if runs[job.id] != nil { continue }
                do {
                    let run = try rebuild(job, nodes)
                    run.roomHeld = nodes.count
                    jobsByState[job.state, default: 0] -= 1
                    activate(run)
                    written.append(run.record)
                } catch {
                    giveBack(nodes.count)
                    failed.append((job, "the stored job could not be rebuilt: \(error)"))
                }
            }
            timekeeper.scheduledJobs -= unreadable.count
            let now = Timestamp.nowMs()
            if let earliest = due.prefix(taken).compactMap(\.job.dueAt).min() {
                logger.debug("due jobs taken in", ["jobs": .int(taken), "late_ms": .int(Int(now - earliest))])
            }
            for (job, reason) in failed {
                logger.error("scheduled job failed when it was due", ["job": .string(job.id), "reason": .string(reason)])
                var record = job.failedWhenLoaded(reason, at: now)
                record.dueAt = nil
                jobsByState[job.state, default: 0] -= 1
                jobsByState[.failed, default: 0] += 1
                written.append(record)
            }
            store.enqueue(jobs: written, nodes: [], bodies: [])
            return taken
        }
    }

    /// Cancels a job read from the store while it waited for its time: it is rebuilt without beginning and
    /// cancelled like a pending job. On the queue.
    func cancelStored(_ stored: JobRecord, _ nodes: [NodeRecord]) -> Result<CancelOutcome, Error> {
        if let live = cancelLive(stored.id) { return live }
        if shuttingDown { return .failure(EngineError.shuttingDown("the server is shutting down")) }
        var job = stored
        job.dueAt = nil
        let run: JobRun
        do {
            run = try rebuild(job, nodes)
        } catch {
            return .failure(error)
        }
        timekeeper.scheduledJobs -= 1
        jobsByState[job.state, default: 0] -= 1
        activate(run, hold: true)
        return cancelLive(job.id) ?? .failure(EngineError.storage("job \(job.id) could not be cancelled"))
    }

    // MARK: - Retry

    /// Runs a failed or cancelled job again (API.md §8): its succeeded nodes keep their results, every other node
    /// is reset to pending, `attempt` grows by one. `completion` runs once, on some other thread, when the store
    /// has committed the reset (an answer promises it survives a crash), or with the error that kept it from
    /// being written. Never waits on the caller's thread.
    public func retry(id: String, _ completion: @escaping @Sendable (Result<RetryOutcome, Error>) -> Void) {
        timekeeper.queue.async { self.retryNow(id: id, completion) }
    }

    /// On the timekeeper's queue.
    private func retryNow(id: String, _ completion: @escaping @Sendable (Result<RetryOutcome, Error>) -> Void) {
        do {
            let early: Result<RetryOutcome, Error>? = queue.sync {
                if shuttingDown { return .failure(EngineError.shuttingDown("the server is shutting down")) }
                guard let run = visibleRun(id) else { return nil }
                switch run.record.state {
                case .failed, .cancelled:
                    // Settled but still in memory (its last state on its way to the disk, or children a
                    // `cancel_remaining: false` list left running): its state goes to the store, the rest stops.
                    flushDirty()
                    run.stop()
                    forget(run)
                    return nil
                default:
                    return .success(.notRetryable(shownRecord(run)))
                }
            }
            if let early { return completion(early) }
            try store.flush()
            guard let stored = try store.job(id: id) else { return completion(.success(.notFound)) }
            guard stored.state == .failed || stored.state == .cancelled else {
                return completion(.success(.notRetryable(stored)))
            }
            let nodes = try store.nodes(jobID: id, includeResults: true)
            let outcome = queue.sync { retryStored(stored, nodes) }
            guard case .success(.retrying) = outcome else { return completion(outcome) }
            store.flush { committed in
                // Off the store's writer thread. A read that cached the settled job before the commit is undone.
                DispatchQueue.global().async {
                    self.settledJobs.remove(id)
                    switch committed {
                    case .success:
                        // Servers sharing a database: its place among its key's waiting jobs over all of them.
                        if case .success(.retrying(let job)) = outcome {
                            return completion(.success(.retrying(self.withStorePosition(job))))
                        }
                        completion(outcome)
                    case .failure(let error): completion(.failure(error))
                    }
                }
            }
        } catch {
            completion(.failure(error))
        }
    }

    /// Resets the stored job and its unsucceeded nodes, queues the rows, and begins the run (or stores it to wait
    /// for a `not_before` still ahead). On the queue.
    private func retryStored(_ stored: JobRecord, _ storedNodes: [NodeRecord]) -> Result<RetryOutcome, Error> {
        if let run = runs[stored.id] { return .success(.notRetryable(shownRecord(run))) }
        let now = Timestamp.nowMs()
        let dueAt = stored.notBefore.flatMap { $0 > now ? $0 : nil }
        if dueAt == nil, unsettledJobs >= configuration.maxActiveJobs { return .success(.queueFull) }
        var nodes = storedNodes.sorted { $0.position < $1.position }
        // A succeeded node keeps its result, and so does everything under it.
        var index: [String: Int] = [:]
        var keep = Array(repeating: false, count: nodes.count)
        var reset: [NodeRecord] = []
        var progress = Progress()
        for i in nodes.indices {
            index[nodes[i].id] = i
            let parentKept = nodes[i].parent.flatMap { index[$0] }.map { keep[$0] } ?? false
            keep[i] = parentKept || nodes[i].state == .succeeded
            if !keep[i] {
                var node = nodes[i]
                node.state = .pending
                node.attempts = 0
                node.startedAt = nil
                node.finishedAt = nil
                node.elapsedMs = nil
                node.status = nil
                node.error = nil
                node.recovered = false
                node.result = nil
                node.request = nil
                nodes[i] = node
                reset.append(node)
            }
            progress.total += 1
            progress[nodes[i].state] += 1
        }
        var job = stored
        job.attempt = stored.attempt + 1
        job.state = .pending
        job.startedAt = nil
        job.finishedAt = nil
        job.result = nil
        job.error = nil
        job.version = stored.version + 1
        job.retriedAt = now
        job.dueAt = dueAt
        job.progress = progress
        if let dueAt {
            store.enqueue(jobs: [job], nodes: reset, bodies: [])
            jobsByState[stored.state, default: 0] -= 1
            jobsByState[.pending, default: 0] += 1
            timekeeper.scheduledJobs += 1
            timekeeper.scheduled(dueAt: dueAt)
            settledJobs.remove(job.id)
            logger.info("job retried", ["job": .string(job.id), "attempt": .int(job.attempt)])
            return .success(.retrying(job))
        }
        let run: JobRun
        do {
            run = try rebuild(job, nodes)
        } catch {
            return .failure(error)
        }
        store.enqueue(jobs: [job], nodes: reset, bodies: [])
        jobsByState[stored.state, default: 0] -= 1
        activate(run)
        settledJobs.remove(job.id)
        logger.info("job retried", ["job": .string(job.id), "attempt": .int(job.attempt)])
        return .success(.retrying(shownRecord(run)))
    }
}
