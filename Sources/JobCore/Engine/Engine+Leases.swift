import Foundation
import Threads

/// Long-polls on jobs this server does not run (another server owns them, API.md §10): answered when the store
/// says the job changed (a notification from the server that wrote it) or, should that be lost, by a poll.
final class RemoteWaits: Sendable {
    private let byJob = Locked<[String: [Waiter]]>([:])
    /// How often the jobs waited on are read again whatever the notifications say.
    static let pollMs = 1_000

    func add(_ waiter: Waiter, jobID: String) {
        byJob.withLock { $0[jobID, default: []].append(waiter) }
    }

    /// The waiters still waiting, by job, after dropping those already answered.
    func pending(_ ids: [String]?) -> [String: [Waiter]] {
        byJob.withLock { all in
            var found: [String: [Waiter]] = [:]
            for id in ids ?? Array(all.keys) {
                guard let list = all[id] else { continue }
                let live = list.filter { !$0.done }
                all[id] = live.isEmpty ? nil : live
                if !live.isEmpty { found[id] = live }
            }
            return found
        }
    }

    func removeAll() -> [String: [Waiter]] {
        byJob.withLock { all in
            defer { all.removeAll() }
            return all
        }
    }
}

/// Event streams on jobs other servers run: each follows its job from the store, on one serial queue (so that its
/// batches go out in order), whenever the job is announced changed and at each poll.
final class RemoteStreams: @unchecked Sendable {
    // @unchecked: `streams` is touched only on `queue`.
    let queue = DispatchQueue(label: "jobserver.remote-events")
    var streams: [String: [Stream]] = [:]

    /// Follows `job` for `subscriber` from its state in `job` and `nodes`; on `queue`.
    func follow(_ subscriber: JobEventSubscriber, job: JobRecord, nodes: [NodeRecord]) {
        streams[job.id, default: []].append(Stream(subscriber: subscriber, job: job, nodes: nodes))
    }

    final class Stream {
        let subscriber: JobEventSubscriber
        var job: JobRecord
        var nodeStates: [String: NodeState]

        init(subscriber: JobEventSubscriber, job: JobRecord, nodes: [NodeRecord]) {
            self.subscriber = subscriber
            self.job = job
            var states: [String: NodeState] = [:]
            for node in nodes { states[node.id] = node.state }
            self.nodeStates = states
        }
    }
}

extension Engine: SharedStoreDelegate {
    /// After `start`: leases renewed and claimed from now on, and the poll behind remote long-polls.
    func startSharing() {
        guard let shared else { return }
        shared.beginLeasing()
        let timer = DispatchSource.makeTimerSource(queue: DispatchQueue.global(qos: .utility))
        timer.schedule(
            deadline: .now() + .milliseconds(RemoteWaits.pollMs), repeating: .milliseconds(RemoteWaits.pollMs))
        timer.setEventHandler { [weak self] in
            self?.checkRemoteWaiters(nil)
            self?.checkRemoteStreams(nil)
        }
        timer.resume()
        queue.sync { remotePollTimer = timer }
    }

    /// Answers the long-polls on jobs of other servers with the job as it is (the server is stopping).
    func answerRemoteWaiters() {
        remotePollTimer?.cancel()
        remotePollTimer = nil
        endRemoteStreams()
        let all = remoteWaits.removeAll()
        guard !all.isEmpty else { return }
        onReadQueue {
            for (id, list) in all {
                let job = (try? self.storedJob(id: id)) ?? nil
                for waiter in list { waiter.fire(job) }
            }
        }
    }

    /// Reads the jobs waited on (`nil`: all of them) and answers the waiters their change satisfies.
    func checkRemoteWaiters(_ ids: [String]?) {
        let pending = remoteWaits.pending(ids)
        guard !pending.isEmpty else { return }
        onReadQueue {
            for (id, list) in pending {
                let job: JobRecord?
                do {
                    job = try self.storedJob(id: id)
                } catch {
                    continue  // the timeout answers, or the next poll
                }
                for waiter in list where job.map(waiter.isSatisfied) ?? true { waiter.fire(job) }
            }
        }
    }

    /// Waits for a job another server runs: registered for its notifications and the poll; `waiter` already
    /// carries its timeout.
    func waitRemotely(_ waiter: Waiter, id: String) {
        remoteWaits.add(waiter, jobID: id)
    }

    /// Cancels a job another server runs (API.md §10): the request is written, then the owner is told; the
    /// answer waits (up to two lease times and a bit, for a dead owner's jobs to be taken over) for the job
    /// to settle, then says what the owner did, as it would on one server.
    func cancelElsewhere(id: String, _ completion: @escaping @Sendable (Result<CancelOutcome, Error>) -> Void) {
        guard let shared else { return completion(.failure(EngineError.storage("job \(id) is not running on this server"))) }
        do {
            guard try shared.requestCancel(id: id) else {
                // Settled meanwhile.
                guard let job = try store.job(id: id) else { return completion(.success(.notFound)) }
                return completion(.success(job.state == .cancelled ? .alreadyCancelled(job) : .alreadySettled(job)))
            }
        } catch {
            return completion(.failure(error))
        }
        let timeoutMs = Int(min(Int64(Int32.max), 2 * shared.leaseTtlMs + 5_000))
        _ = waitForChange(id: id, afterVersion: nil, timeoutMs: timeoutMs) { job in
            guard let job else { return completion(.success(.notFound)) }
            switch job.state {
            case .succeeded, .failed, .skipped: completion(.success(.alreadySettled(job)))
            default: completion(.success(.cancelling(job)))
            }
        }
    }

    /// Sends a stream's first batch and follows the job from the store from then on.
    func streamRemotely(_ subscriber: JobEventSubscriber, first: JobEventBatch, nodes: [NodeRecord]) {
        let fanOut = eventHub.fanOut
        remoteStreams.queue.async {
            fanOut.async { subscriber.deliver(first) }
            self.remoteStreams.follow(subscriber, job: first.job, nodes: nodes)
        }
    }

    /// Reads the jobs streamed from the store (`nil`: all of them) and sends each stream what changed.
    func checkRemoteStreams(_ ids: [String]?) {
        let fanOut = eventHub.fanOut
        remoteStreams.queue.async {
            for id in ids ?? Array(self.remoteStreams.streams.keys) {
                guard var list = self.remoteStreams.streams[id] else { continue }
                list.removeAll { $0.subscriber.done }
                guard !list.isEmpty else {
                    self.remoteStreams.streams[id] = nil
                    continue
                }
                let read: JobRecord?
                do {
                    read = try self.storedJob(id: id)
                } catch {
                    continue  // the next poll tries again
                }
                guard let job = read else {
                    for subscriber in list.map(\.subscriber) { fanOut.async { subscriber.deliver(nil) } }
                    self.remoteStreams.streams[id] = nil
                    continue
                }
                guard list.contains(where: { $0.job.version < job.version }),
                    let nodes = try? self.store.nodes(jobID: id, includeResults: false)
                else {
                    self.remoteStreams.streams[id] = list
                    continue
                }
                for stream in list where stream.job.version < job.version {
                    let changed = nodes.filter { stream.nodeStates[$0.id] != $0.state }.inTreeOrder()
                    let batch = JobEventBatch(
                        job: job, nodes: changed, jobStateChanged: stream.job.state != job.state, isLast: job.state.isSettled)
                    for node in changed { stream.nodeStates[node.id] = node.state }
                    stream.job = job
                    let subscriber = stream.subscriber
                    fanOut.async { subscriber.deliver(batch) }
                }
                list.removeAll { $0.job.state.isSettled }
                self.remoteStreams.streams[id] = list.isEmpty ? nil : list
            }
        }
    }

    /// Ends the streams followed from the store with the job as last read (the server stops).
    func endRemoteStreams() {
        let fanOut = eventHub.fanOut
        remoteStreams.queue.async {
            for (_, list) in self.remoteStreams.streams {
                for stream in list {
                    let batch = JobEventBatch(job: stream.job, nodes: [], jobStateChanged: true, isLast: true)
                    let subscriber = stream.subscriber
                    fanOut.async { subscriber.deliver(batch) }
                }
            }
            self.remoteStreams.streams.removeAll()
        }
    }

    // MARK: SharedStoreDelegate (called on the store's threads)

    public func leasesLost(_ ids: [String]) {
        queue.async {
            for id in ids { self.dropLostRun(id) }
        }
    }

    public func jobsClaimed(
        _ jobs: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob], cancelRequested: Set<String>
    ) {
        queue.async { self.adoptClaimed(jobs, unreadable: unreadable, cancelRequested: cancelRequested) }
    }

    public func cancelRequested(_ ids: [String]) {
        queue.async {
            for id in ids where self.runs[id] != nil {
                self.logger.info("cancel asked for on another server", ["job": .string(id)])
                _ = self.cancelLive(id)
            }
        }
    }

    /// A settled job changes again only when another server retries or deletes it: its cached answer goes.
    public func jobsChanged(_ ids: [String]) {
        for id in ids { settledJobs.remove(id) }
        checkRemoteWaiters(ids)
        checkRemoteStreams(ids)
    }

    public func leasesRenewed() {
        queue.async {
            self.schedulePump()
            self.admitWaitingKeys()
        }
    }

    // MARK: On the queue

    /// Another server took the job over: its run stops here without writing anything more (the store would
    /// not write it anyway), and its long-polls wait on the job as another server's.
    private func dropLostRun(_ id: String) {
        guard let run = runs[id] else { return }
        logger.warning("lease lost to another server; the job stops here", ["job": .string(id)])
        run.stop()
        if !run.record.state.isSettled { leaveGate(run) }
        let waiting = waiters.take(jobID: id)
        let streams = eventHub.detach(id)
        let nodes = run.nodeSnapshots(includeResults: false)
        let record = run.record
        forget(run)
        for waiter in waiting { waitRemotely(waiter, id: id) }
        if !streams.isEmpty {
            remoteStreams.queue.async {
                for subscriber in streams { self.remoteStreams.follow(subscriber, job: record, nodes: nodes) }
            }
        }
        checkRemoteWaiters([id])
        checkRemoteStreams([id])
    }

    /// Resumes jobs this server claimed after their owner's lease expired, as `start` resumes the jobs of the
    /// previous run (API.md §4 restart rules); a job that cannot be rebuilt fails.
    private func adoptClaimed(
        _ claimed: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob], cancelRequested: Set<String>
    ) {
        var refused: [(job: JobRecord, reason: String)] = unreadable.map {
            ($0.job, "the stored job could not be read: \($0.error.description)")
        }
        var adopted = 0
        for (job, nodes) in claimed where runs[job.id] == nil {
            if shuttingDown { continue }  // given up again when the store closes
            do {
                let run = try rebuild(job, nodes)
                let cancel = cancelRequested.contains(job.id)
                activate(run, resumed: job.state == .running, hold: cancel)
                if cancel { _ = cancelLive(job.id) }
                adopted += 1
            } catch {
                refused.append((job, "the stored job could not be rebuilt: \(error)"))
            }
        }
        if !refused.isEmpty {
            let now = Timestamp.nowMs()
            var failed: [JobRecord] = []
            for (job, reason) in refused {
                logger.error("claimed job failed", ["job": .string(job.id), "reason": .string(reason)])
                failed.append(job.failedWhenLoaded(reason, at: now))
            }
            store.enqueue(jobs: failed, nodes: [], bodies: [])
        }
        if adopted > 0 { logger.info("took over jobs", ["resumed": .int(adopted), "failed": .int(refused.count)]) }
    }
}
