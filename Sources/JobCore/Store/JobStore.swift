import Threads

/// Why a store operation failed: a kind callers can switch on, a readable
/// message, and the SQLite result code when SQLite reported it.
public struct StoreError: Error, Equatable, CustomStringConvertible, Sendable {
    /// The class of failure. A struct with static members rather than an enum,
    /// so that adding a kind breaks no caller's `switch`.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }

        /// The database could not be opened (missing folder, permissions, not a database file).
        public static let open = Kind("open")
        /// The schema could not be brought to the current version, or the file is from a newer version.
        public static let migrate = Kind("migrate")
        /// Reading or writing the file failed (disk, I/O, an unexpected SQLite error).
        public static let io = Kind("io")
        /// The disk or database is full.
        public static let full = Kind("full")
        /// The file, or a stored value, is not what the store wrote.
        public static let corrupt = Kind("corrupt")
        /// The database stayed locked by another process for too long.
        public static let busy = Kind("busy")
        /// A row broke a constraint, e.g. a job id that already exists.
        public static let constraint = Kind("constraint")
        /// A list cursor that no listing produced.
        public static let badCursor = Kind("bad_cursor")
        /// The store was closed.
        public static let closed = Kind("closed")
        /// Writes are failing (disk full, I/O errors) and the store is retrying them; new work is refused
        /// until a retry commits.
        public static let unavailable = Kind("unavailable")

        /// The kind's name, e.g. `bad_cursor`.
        public var description: String { name }
    }

    /// The class of failure.
    public var kind: Kind
    /// What went wrong, in words.
    public var message: String
    /// The (extended) SQLite result code, when SQLite reported the failure.
    public var sqliteCode: Int32?

    /// An error of `kind`, with a message and optionally the SQLite code behind it.
    public init(_ kind: Kind, _ message: String, sqliteCode: Int32? = nil) {
        self.kind = kind
        self.message = message
        self.sqliteCode = sqliteCode
    }

    /// True when the failure is a resource running out — disk full, an I/O error, the lock held too long,
    /// no file descriptor or memory left — which passes without a code change: the write can be tried
    /// again later, and a client asked to retry. False for real bugs (a corrupt file, misuse, a broken constraint).
    public var isResourceFailure: Bool {
        switch kind {
        case .full, .busy, .unavailable: return true
        case .io, .open:
            // `io` is also what an unexpected SQLite code becomes; only these codes are a resource running out.
            guard let sqliteCode else { return false }
            return StoreError.resourceCodes.contains(sqliteCode & 0xFF)
        default: return false
        }
    }

    /// `store <kind>: <message> (sqlite <code>)`.
    public var description: String {
        if let sqliteCode { return "store \(kind): \(message) (sqlite \(sqliteCode))" }
        return "store \(kind): \(message)"
    }
}

/// How the store's writes are going, for `/healthz` and `/metrics`.
public struct StoreHealth: Sendable, Equatable {
    /// True from a write that failed for lack of a resource (disk full, I/O error, lock, descriptors)
    /// until a write commits again. Meanwhile state changes are kept and retried, and new work is refused.
    public var degraded = false
    /// Write transactions that failed since the store was opened.
    public var writeFailures = 0
    /// Jobs and nodes whose latest state is kept for the next retry (each counted once, however often it changed).
    public var pendingChanges = 0
    /// State changes given up because they failed for a reason other than a resource (a bug, a corrupt file).
    public var droppedChanges = 0
    /// The failure that made the store degraded; `nil` when it is not.
    public var lastError: StoreError?

    public init() {}
}

/// What `createJob` did.
public enum CreateOutcome: Sendable, Equatable {
    /// The job was stored (and is durable).
    case created(JobRecord)
    /// A job with the same idempotency key and the same request hash existed; nothing was stored.
    case existing(JobRecord)
    /// A job with the same idempotency key but another request hash existed; nothing was stored.
    case conflict(JobRecord)
}

/// One page of a job listing.
public struct JobPage: Sendable, Equatable {
    /// Newest first.
    public var jobs: [JobRecord]
    /// Pass to `listJobs` to get the next page; `nil` on the last page.
    public var nextCursor: String?

    /// A page of `jobs`, with the cursor of the next one.
    public init(jobs: [JobRecord], nextCursor: String?) {
        self.jobs = jobs
        self.nextCursor = nextCursor
    }
}

/// A stored unfinished job that could not be read whole.
public struct UnreadableJob: Sendable {
    /// What could be read: id, state, times and progress (no `request`, `metadata`, `result` or `error`).
    public var job: JobRecord
    /// Why the rest could not.
    public var error: StoreError

    public init(job: JobRecord, error: StoreError) {
        self.job = job
        self.error = error
    }
}

/// What `JobStore.showStoredJob` found.
public enum StoredJobShown<T> {
    case notFound
    /// The job as `jobWithoutRequest` reads it, its result (if any) as values.
    case record(JobRecord)
    /// The job read without its result, and what `make` made of it.
    case shown(JobRecord, T)
}

/// What `JobStore.showStoredNodeList` found.
public enum StoredNodeListShown<T> {
    case notFound
    /// The job's state and its nodes as `nodes(jobID:includeResults: true)` reads them, results as values.
    case nodes(NodeState, [NodeRecord])
    /// What `make` made of the settled job's nodes.
    case shown(T)
}

extension JobStore {
    /// `dueJobs` with every job's nodes, however many.
    public func dueJobs(
        atOrBeforeMs: Int64, after: (dueAt: Int64, id: String)?, limit: Int, unreadable: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        try dueJobs(
            atOrBeforeMs: atOrBeforeMs, after: after, limit: limit, maxNodes: Int.max, skipping: { _ in false },
            unreadable: &unreadable)
    }

    /// The job's nodes as values: a store that cannot write results from its rows' text.
    public func showStoredNodeList<T>(jobID: String, _ make: (StoredNodeListText) throws -> T) throws -> StoredNodeListShown<T> {
        try stateAndNodes(jobID: jobID, includeResults: true).map { .nodes($0.state, $0.nodes) } ?? .notFound
    }

    /// A stored job's state and nodes (in the store's order, not yet in tree order); `nil` when there is no such
    /// job.
    public func stateAndNodes(jobID: String, includeResults: Bool) throws -> (state: NodeState, nodes: [NodeRecord])? {
        guard let state = try jobState(id: jobID) else { return nil }
        let nodes = try self.nodes(jobID: jobID, includeResults: includeResults)
        // Every job has its root node: none means it was deleted between the two reads.
        return nodes.isEmpty ? nil : (state, nodes)
    }

    /// The job as `jobWithoutRequest` reads it: a store that cannot write a result from its rows' text.
    public func showStoredJob<T>(id: String, _ make: (JobRecord, StoredResultText) throws -> T) throws -> StoredJobShown<T> {
        try jobWithoutRequest(id: id).map(StoredJobShown.record) ?? .notFound
    }

    /// Queues state changes that are not urgent (see the requirement).
    public func enqueue(jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)]) {
        enqueue(jobs: jobs, nodes: nodes, bodies: bodies, urgent: false)
    }

    /// Inserts a job and all its nodes in one transaction, durable when this returns.
    public func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?
    ) throws -> CreateOutcome {
        try createJob(job, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash, nodesMayFollow: false)
    }

    /// As `createJob(_:nodes:idempotencyKey:requestHash:nodesMayFollow:completion:)`, blocking the calling thread
    /// until the answer: for tools and tests, which may wait; the engine never does.
    public func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?, nodesMayFollow: Bool
    ) throws -> CreateOutcome {
        try waitForCompletion { done in
            createJob(
                job, nodes: nodes, idempotencyKey: idempotencyKey, requestHash: requestHash,
                nodesMayFollow: nodesMayFollow, completion: done)
        }.get()
    }

    /// As `flush(_:)`, blocking the calling thread until the answer: for tools and tests, which may wait.
    public func flush() throws {
        try waitForCompletion { done in flush(done) }.get()
    }

    /// As `whenCommitted(_:)`, blocking the calling thread until the answer: for tools and tests, which may wait.
    public func waitUntilCommitted() throws {
        try waitForCompletion { done in whenCommitted(done) }.get()
    }

    /// As `deleteJob(id:_:)`, blocking the calling thread until the answer: for tools and tests, which may wait.
    public func deleteJob(id: String) throws -> Bool {
        try waitForCompletion { done in deleteJob(id: id, done) }.get()
    }

    /// As `unfinishedJobs(unreadable:)`, throwing the first job's error if any cannot be read.
    public func unfinishedJobs() throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        var unreadable: [UnreadableJob] = []
        let jobs = try unfinishedJobs(unreadable: &unreadable)
        if let first = unreadable.first { throw first.error }
        return jobs
    }
}

/// Where jobs, their nodes and response bodies are persisted.
///
/// Writes are serialised by the store; every method may be called from any
/// thread. Reads see committed data only: what was `enqueue`d becomes visible
/// once the writer commits it (`flush` waits for that).
public protocol JobStore: AnyObject, Sendable {
    /// Inserts a job, durable when `completion` is called, and its nodes: in the same transaction, or, with
    /// `nodesMayFollow` where the store allows it (SQLite), queued before `completion` is called and stored with the
    /// next commit (a job found at start without its node rows makes them again from its request: `Engine.rebuild`).
    /// With an idempotency key: if a job with that key exists, `.existing(job)` when `requestHash` matches, else
    /// `.conflict(job)`. Returns at once; `completion` runs once, on the store's thread, so it must be quick.
    /// Fails with a `StoreError` (kind `constraint` when the job id already exists).
    func createJob(
        _ job: JobRecord, nodes: [NodeRecord], idempotencyKey: String?, requestHash: String?, nodesMayFollow: Bool,
        completion: @escaping @Sendable (Result<CreateOutcome, StoreError>) -> Void)

    /// Queues state changes (whole records replace the stored ones; nodes matched by (jobID, position)); returns at once.
    /// Committed together with other queued changes by the writer. A change that cannot be written for lack of a
    /// resource (disk full, I/O error) is kept — only the latest record of each job and node — and retried with
    /// backoff until it commits.
    ///
    /// A job's `request` is never rewritten (it cannot change after creation), and
    /// changes to jobs or nodes that do not exist (e.g. deleted meanwhile) are ignored.
    ///
    /// Changes nobody waits on may wait for CPU time nothing else wants (`WriteQueue`); `urgent` ones, and any that
    /// settle a job (webhooks, a concurrency key's next job and the job's leaving memory wait for that commit), are
    /// written as soon as the writer can.
    func enqueue(
        jobs: [JobRecord], nodes: [NodeRecord], bodies: [(jobID: String, nodeID: String, body: StoredBody)], urgent: Bool)

    /// Queues rows for nodes that are not stored yet, to be inserted with the next commit (a change queued after
    /// them changes the row to insert): the nodes of a job whose creation was answered before they were stored, and
    /// which the store lost in a crash.
    func enqueue(unstoredNodes: [NodeRecord])

    /// Calls `completion` (on the store's thread, so it must be quick) once everything enqueued before this call is
    /// committed; never blocks. Fails with a `StoreError` if some change enqueued before it could not be written yet
    /// (it is kept and retried: see `whenCommitted`), or had to be given up since the previous `flush`.
    func flush(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void)

    /// Calls `completion` (on the store's thread, so it must be quick) once everything enqueued before this call is
    /// committed, however many retries of a failing disk that takes (unlike `flush`, which reports the first
    /// failure); never blocks. Fails with a `StoreError` when the store closes first, or when changes had to be
    /// given up (see `StoreHealth.droppedChanges`).
    func whenCommitted(_ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void)

    /// How writes are going.
    var health: StoreHealth { get }

    /// Waits, for at most `milliseconds`, until `accept` holds for the health (at once, and after each change the
    /// writer makes to it); the answer is whether it held. `accept` must be quick: the writer waits while it runs.
    func waitForHealth(milliseconds: Int64, until accept: (StoreHealth) -> Bool) -> Bool

    /// The job with everything stored about it, or `nil`.
    func job(id: String) throws -> JobRecord?

    /// The job as reads show it: everything but the submitted `request` (`.null`), which is neither read nor parsed.
    func jobWithoutRequest(id: String) throws -> JobRecord?

    /// A settled job as reads show it, made into `T` by `make` with its result written as text from its nodes' rows
    /// (`StoredResultText`) where the store can, so that the result is never held as values; otherwise (and for a
    /// job not settled, or whose row holds its result in full) the job as `jobWithoutRequest` reads it.
    func showStoredJob<T>(id: String, _ make: (JobRecord, StoredResultText) throws -> T) throws -> StoredJobShown<T>

    /// The job's nodes with their results (in the store's order, not yet in tree order), read in one snapshot; a
    /// settled job's handed to `make` as a `StoredNodeListText` where the store can write its results from the rows'
    /// text, so that they are never held as values.
    func showStoredNodeList<T>(jobID: String, _ make: (StoredNodeListText) throws -> T) throws -> StoredNodeListShown<T>

    /// The job's state alone, or `nil` when there is no such job.
    func jobState(id: String) throws -> NodeState?

    /// The job's version alone, or `nil` when there is no such job: whether a reader's copy is still the job as
    /// it is, without reading (or assembling) the rest.
    func jobVersion(id: String) throws -> Int64?

    /// How many nodes the job has (its `progress.total`), or `nil` when there is no such job: how large an answer
    /// made from its rows is about to be, without reading them.
    func nodeCount(id: String) throws -> Int?

    /// Newest first (by id, which sorts by creation time). `cursor` is opaque (from nextCursor); an invalid cursor throws StoreError with kind badCursor.
    ///
    /// To keep listings light, the jobs come without `result` (`nil`) and without
    /// `request` (`.null`); `job(id:)` has them.
    func listJobs(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage

    /// Tree order (position). Results only if includeResults (otherwise result = nil, to keep reads light).
    func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord]

    /// One node, with its result, or `nil`.
    func node(jobID: String, nodeID: String) throws -> NodeRecord?

    /// A fetch node's stored response body, or `nil`.
    func body(jobID: String, nodeID: String) throws -> StoredBody?

    /// Deletes a job with its nodes and bodies, after everything queued before; `completion` runs once, on the
    /// store's thread (so it must be quick), with false if there was no such job, once the deletion is committed.
    func deleteJob(id: String, _ completion: @escaping @Sendable (Result<Bool, StoreError>) -> Void)

    /// Jobs whose state is pending or running, oldest first, with their nodes (results included) — for recovery on start.
    /// A job whose row or nodes cannot be read is left out and appended to `unreadable`, so that one damaged job
    /// does not keep the others from resuming.
    /// - Throws: `StoreError` when the store cannot be read at all.
    func unfinishedJobs(unreadable: inout [UnreadableJob]) throws -> [(job: JobRecord, nodes: [NodeRecord])]

    /// Nodes still pending or running in jobs that have settled (a crash came between the two), in job and tree order.
    func unsettledNodesOfSettledJobs() throws -> [NodeRecord]

    /// Deletes settled jobs finished before `finishedBeforeMs`; returns how many.
    func sweep(finishedBeforeMs: Int64) throws -> Int

    /// Counts of jobs by state (for /metrics); every state is present.
    func jobCounts() throws -> [NodeState: Int]

    /// Counts by state of the settled jobs finished before `finishedBeforeMs`: what `sweep` with the same bound deletes.
    func settledJobCounts(finishedBeforeMs: Int64) throws -> [NodeState: Int]

    /// Commits what is queued and releases the database; later calls throw kind `closed`.
    func close()

    /// Jobs waiting in the store (`due_at` set: for their `not_before`, or for room) that are due by `atOrBeforeMs`,
    /// in `(due_at, id)` order after `after`, at most `limit`, with their nodes; a job that cannot be read is
    /// appended to `unreadable`. The read stops after the job whose nodes take those read over `maxNodes`; a job
    /// `skipping` names (taken in already) comes without its nodes, which are neither read nor counted.
    func dueJobs(
        atOrBeforeMs: Int64, after: (dueAt: Int64, id: String)?, limit: Int, maxNodes: Int, skipping: (String) -> Bool,
        unreadable: inout [UnreadableJob]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])]

    /// The earliest `due_at` later than `afterMs` of the jobs waiting in the store, or `nil`.
    func nextDueAt(after afterMs: Int64) throws -> Int64?

    /// How many jobs wait in the store for their time.
    func scheduledJobCount() throws -> Int

    /// Stores a map's items, after everything queued before, and its copies (new node rows): in the same transaction,
    /// or (SQLite) with each copy's first change, since the items make them again; `completion` runs on the store's
    /// thread once the items are committed, so it must be quick.
    func expandMap(_ expansion: MapExpansionRecord, _ completion: @escaping @Sendable (Result<Void, StoreError>) -> Void)

    /// The job's stored map expansions, oldest first, without their nodes (those are read with the job's).
    func mapExpansions(jobID: String) throws -> [MapExpansionRecord]
}

/// A `map` node's expansion as stored: the items it resolved and its copies, whose positions begin at
/// `firstPosition` (API.md §7.1).
public struct MapExpansionRecord: Sendable {
    public var jobID: String
    public var nodeID: String
    public var firstPosition: Int
    public var items: JSONValue
    public var nodes: [NodeRecord]

    public init(jobID: String, nodeID: String, firstPosition: Int, items: JSONValue, nodes: [NodeRecord]) {
        self.jobID = jobID
        self.nodeID = nodeID
        self.firstPosition = firstPosition
        self.items = items
        self.nodes = nodes
    }
}
