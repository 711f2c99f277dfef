import Foundation
import Threads

/// What one job's event streams are sent at once (API.md §8 `GET /v1/jobs/{id}/events`): the job, the nodes whose
/// state changed, and whether this is the last batch (the job settled, or the server stops).
///
/// One batch is shared by every stream of the job, so its text is made once (`rendered`), not once per stream.
public final class JobEventBatch: @unchecked Sendable {
    // @unchecked: every stored property is immutable but `cache`, which is read and written with `lock` held.
    /// The job without its result.
    public let job: JobRecord
    /// Nodes whose state changed, without results, in tree order.
    public let nodes: [NodeRecord]
    /// The job's state changed (always true for the first batch of a stream).
    public let jobStateChanged: Bool
    /// Nothing follows: the stream ends after this batch.
    public let isLast: Bool
    private let lock = Lock()
    private var cache: [UInt8]?

    init(job: JobRecord, nodes: [NodeRecord], jobStateChanged: Bool, isLast: Bool) {
        var job = job
        job.result = nil
        self.job = job
        self.nodes = nodes
        self.jobStateChanged = jobStateChanged
        self.isLast = isLast
    }

    /// `render(self)`, made on the first call and kept for the other streams.
    public func rendered(_ render: (JobEventBatch) -> [UInt8]) -> [UInt8] {
        lock.withLock {
            if let cache { return cache }
            let bytes = render(self)
            cache = bytes
            return bytes
        }
    }
}

/// One event stream's registration with the engine.
final class JobEventSubscriber: Cancellable, @unchecked Sendable {
    // @unchecked: `handler` is read and cleared with `lock` held; `jobID` is immutable; `engine` is weak and only
    // used to ask for the removal.
    let jobID: String
    private let lock = Lock()
    private var handler: (@Sendable (JobEventBatch?) -> Void)?
    weak var engine: Engine?

    init(jobID: String, handler: @escaping @Sendable (JobEventBatch?) -> Void) {
        self.jobID = jobID
        self.handler = handler
    }

    /// Passes a batch on, unless cancelled; after the last one the handler is let go.
    func deliver(_ batch: JobEventBatch?) {
        let handler: (@Sendable (JobEventBatch?) -> Void)? = lock.withLock {
            let current = self.handler
            if batch == nil || batch?.isLast == true { self.handler = nil }
            return current
        }
        handler?(batch)
    }

    func cancel() {
        lock.withLock { handler = nil }
        engine?.removeEventSubscriber(self)
    }

    /// Cancelled, or sent its last batch.
    var done: Bool { lock.withLock { handler == nil } }
}

/// The engine's side of the event streams: who listens to which job, and, from a job's first stream on, when each
/// of its nodes last changed state (the job's version then), so that a stream resumed from a version gets the nodes
/// changed since. Touched only on the engine's queue; batches are handed to the streams in order on `fanOut`.
final class JobEventHub {
    let fanOut = DispatchQueue(label: "jobserver.events")
    private var subscribers: [String: [JobEventSubscriber]] = [:]
    /// Per job in memory: each node's state as last published, and the job's version when it changed. A class, so
    /// that a flush updates the arrays in place instead of copying them out of the dictionary and back.
    private final class Track {
        var nodeStates: [NodeState] = []
        var nodeVersions: [Int64] = []
        var jobState = NodeState.pending
    }
    private var tracks: [String: Track] = [:]

    var subscriberCount: Int { subscribers.values.reduce(0) { $0 + $1.count } }

    /// Notes the state changes among `dirty` (before the run forgets which nodes were dirty) and sends them to the
    /// job's streams.
    func record(_ run: JobRun, dirty: Set<Int>) {
        let id = run.id
        // Jobs nobody follows cost nothing here: tracking starts with a job's first stream.
        guard let track = tracks[id] else { return }
        if track.nodeStates.count < run.nodes.count {
            // A map's copies join the run as it goes: they start pending.
            let added = run.nodes.count - track.nodeStates.count
            track.nodeStates += repeatElement(.pending, count: added)
            track.nodeVersions += repeatElement(0, count: added)
        }
        var changed: [Int] = []
        for i in dirty where i < run.nodes.count && run.nodes[i].state != track.nodeStates[i] {
            track.nodeStates[i] = run.nodes[i].state
            track.nodeVersions[i] = run.record.version
            changed.append(i)
        }
        let jobChanged = track.jobState != run.record.state
        track.jobState = run.record.state
        guard let listening = subscribers[id], !listening.isEmpty else { return }
        let settled = run.record.state.isSettled
        guard !changed.isEmpty || jobChanged || settled else { return }
        let now = Timestamp.nowMs()
        let batch = JobEventBatch(
            job: run.record, nodes: changed.sorted().map { run.nodeSnapshot($0, includeResult: false, nowMs: now) },
            jobStateChanged: jobChanged, isLast: settled)
        if settled { subscribers[id] = nil }
        fanOut.async { for subscriber in listening { subscriber.deliver(batch) } }
    }

    /// Registers a stream of a run in memory and sends it its first batch: the job, and with `afterVersion` the
    /// nodes changed at or after that version. The events of one batch share the job's version, so a client cut off
    /// among them names a version whose events it has not all seen: they are sent again. A node whose change is not
    /// known (settled before a restart) counts as changed too: a resumed stream may see a node twice, never miss one.
    func add(_ subscriber: JobEventSubscriber, run: JobRun, afterVersion: Int64?) {
        // Changes made since the last flush go out to the other streams now, so that the first batch (made from
        // the run as it is) and the ones that follow neither repeat nor skip them.
        record(run, dirty: run.dirtyNodes)
        if tracks[run.id] == nil {
            // From now on changes are told apart from the states the run has now; earlier ones have no version (0).
            let track = Track()
            track.nodeStates = run.nodes.map(\.state)
            track.nodeVersions = Array(repeating: 0, count: run.nodes.count)
            track.jobState = run.record.state
            tracks[run.id] = track
        }
        var nodes: [NodeRecord] = []
        // Versions only grow: after the job's current one nothing has changed, whatever is known of its nodes.
        if let after = afterVersion, after <= run.record.version {
            let versions = tracks[run.id]?.nodeVersions ?? []
            let now = Timestamp.nowMs()
            for i in run.nodes.indices {
                let version = i < versions.count ? versions[i] : 0
                // Version 0: no change seen since the run was built (pending from the start, or settled before).
                if version == 0 ? run.nodes[i].state != .pending : version >= after {
                    nodes.append(run.nodeSnapshot(i, includeResult: false, nowMs: now))
                }
            }
        }
        let settled = run.record.state.isSettled
        let batch = JobEventBatch(job: run.record, nodes: nodes, jobStateChanged: true, isLast: settled)
        if !settled { subscribers[run.id, default: []].append(subscriber) }
        fanOut.async { subscriber.deliver(batch) }
    }

    func remove(_ subscriber: JobEventSubscriber) {
        subscribers[subscriber.jobID]?.removeAll { $0 === subscriber }
        if subscribers[subscriber.jobID]?.isEmpty == true { subscribers[subscriber.jobID] = nil }
    }

    /// Takes the job's streams away (another server runs the job now): they follow it from the store.
    func detach(_ id: String) -> [JobEventSubscriber] {
        tracks[id] = nil
        return subscribers.removeValue(forKey: id) ?? []
    }

    /// Sends every stream a last batch with its job as it is (the server stops).
    func endAll(_ job: (String) -> JobRecord?) {
        for (id, listening) in subscribers {
            guard let record = job(id) else { continue }
            let batch = JobEventBatch(job: record, nodes: [], jobStateChanged: true, isLast: true)
            fanOut.async { for subscriber in listening { subscriber.deliver(batch) } }
        }
        subscribers.removeAll()
    }

    /// The run left memory: what was kept for its resumes goes too.
    func forget(_ id: String) {
        tracks[id] = nil
    }
}
