/// How the engine runs jobs.
public struct EngineConfiguration: Sendable {
    /// Limits a submitted graph is validated under; a stored job is rebuilt on start under `limits.forStoredJobs`.
    public var limits = Limits()
    /// At most this many jobs pending or running at once; more submissions are refused (429).
    public var maxActiveJobs = 10_000
    /// The nodes the jobs in memory may hold together (`NodeRoom`): a job that would take them over waits in the
    /// store until room is given back; 0: no bound. The server sets it from `--max-active-nodes`.
    public var maxActiveNodes = 0
    /// At most this many fetches handed to the fetcher at once; the rest wait in the engine's fair queue.
    public var maxConcurrentFetches = 256
    /// At most this many fetches to one host (scheme, host and port) handed to the fetcher at once.
    public var maxPerHost = 16
    /// Settled jobs older than this are deleted; 0 keeps them forever.
    public var retentionMs: Int64 = 7 * 86_400_000
    /// How often the retention sweep runs.
    public var sweepIntervalMs = 60_000
    /// Settled jobs' answers kept in memory, in bytes (bodies, ids and a fixed overhead per entry); 0 keeps none.
    public var settledCacheBytes = 64 << 20
    /// A settled job's answer made at the end from a result that is a list of this many entries or more is written
    /// on every core at once (`EntryRuns`): fewer are not worth handing out.
    public var answerRunsMinimumEntries = 4_096
    /// A submission of this many nodes or more that may start now starts as its creation is written, not once it
    /// is committed (`Engine.startsBeforeCommit`); its answer still waits for the commit.
    public var startBeforeCommitNodes = 1_000
    /// Answers made from the store for jobs of this many nodes or more are made one at a time (`Engine.largeReads`).
    public var largeReadNodes = 10_000
    /// Each job's response byte budget (`ByteBudget`); 0: none. The server sets it from `--max-job-bytes`.
    public var maxJobBytes = 0
    /// The response body bytes all jobs in memory may hold together (`ByteBudget` of scope `.server`), drawn on by
    /// every job's budget; 0: no bound. The server sets it from `--max-response-memory`.
    public var maxResponseMemory = 0
    /// At most this many jobs waiting in the store for their `not_before`; more such submissions are refused (429).
    public var maxScheduledJobs = 1_000_000
    /// Due jobs taken from the store into memory per read.
    public var dueBatchSize = 500
    /// `--host-rate`: request starts per second per host, over all jobs, on top of `maxPerHost`.
    public var hostRates: [HostRate] = []

    public init() {}
}

/// What `Engine.submit` did.
public enum SubmitOutcome: Sendable {
    /// A new job, durable from now on.
    case created(JobRecord)
    /// The job an earlier submission with the same idempotency key and body created.
    case existing(JobRecord)
    /// The idempotency key belongs to a job with another body.
    case conflict(JobRecord)
    /// Too many jobs are pending or running.
    case queueFull
    /// The server is shutting down.
    case shuttingDown
}

/// What `Engine.cancel` did.
public enum CancelOutcome: Sendable {
    /// The job was pending or running; its unsettled nodes are being cancelled.
    case cancelling(JobRecord)
    case alreadyCancelled(JobRecord)
    /// The job had already succeeded or failed.
    case alreadySettled(JobRecord)
    case notFound
}

/// What `Engine.delete` did.
public enum DeleteOutcome: Sendable {
    case deleted
    /// The job is still pending or running.
    case active(JobRecord)
    case notFound
}

/// How the engine writes the answers it keeps (the settled-job cache) or shares (a job's node list, answers read from
/// the store): the server gives its JSON presentation; each `nil` keeps or shares nothing of that kind.
public struct AnswerRendering: Sendable {
    /// Makes a settled job's answer; `nil`: settled jobs are not cached.
    public var settled: (@Sendable (JobRecord) -> [UInt8])?
    /// Makes a settled job's answer with its result written as text from the stored rows (`StoredResultText`),
    /// into memory or a temporary file (`AnswerSink`); `nil`: a stored job's answer is made from its result as
    /// values (`settled`).
    public var settledWithResultText: (@Sendable (JobRecord, StoredResultText) throws -> SettledAnswer)?
    /// Makes a settled job's answer in memory with its result written by the `StoredResultText` given: a running
    /// job's, from the texts its root list's children's results were written to as they came (`AnswerTexts`);
    /// `nil`: from its result as values (`settled`).
    public var settledAround: (@Sendable (JobRecord, StoredResultText) throws -> SettledAnswer)?
    /// Shows a settled job's nodes with their results (in tree order); `nil`: node lists are not shared.
    public var nodeList: (@Sendable ([NodeRecord]) -> [UInt8])?
    /// Shows a stored settled job's nodes with their results written as text from the rows (`StoredNodeListText`),
    /// into memory or a temporary file; `nil`: they are read as values and `nodeList` shows them.
    public var nodeListWithResultText: (@Sendable (StoredNodeListText) throws -> SettledAnswer)?

    public init(
        settled: (@Sendable (JobRecord) -> [UInt8])? = nil,
        settledWithResultText: (@Sendable (JobRecord, StoredResultText) throws -> SettledAnswer)? = nil,
        settledAround: (@Sendable (JobRecord, StoredResultText) throws -> SettledAnswer)? = nil,
        nodeList: (@Sendable ([NodeRecord]) -> [UInt8])? = nil,
        nodeListWithResultText: (@Sendable (StoredNodeListText) throws -> SettledAnswer)? = nil
    ) {
        self.settled = settled
        self.settledWithResultText = settledWithResultText
        self.settledAround = settledAround
        self.nodeList = nodeList
        self.nodeListWithResultText = nodeListWithResultText
    }
}

/// A snapshot of the engine's counters, for `/metrics`.
public struct EngineMetrics: Sendable {
    /// Every stored job by state.
    public var jobsByState: [NodeState: Int] = [:]
    /// The nodes of the active jobs by state.
    public var nodesByState: [NodeState: Int] = [:]
    /// Jobs pending or running.
    public var activeJobs = 0
    /// Fetches waiting in the engine's queue for a free transfer slot.
    public var pendingFetches = 0
    /// Fetches handed to the fetcher and not finished.
    public var fetchesInFlight = 0
    /// Stored jobs that could not be read or rebuilt at start, and were failed with kind `internal`.
    public var jobLoadFailures = 0
    /// Long-polls waiting for a job to change.
    public var longPollsWaiting = 0
    /// Jobs waiting in the store for their `not_before`, or for room (`maxActiveNodes`).
    public var scheduledJobs = 0
    /// Jobs waiting for a slot of their concurrency key.
    public var waitingForKey = 0
    /// Response body bytes the jobs in memory hold (counted against `maxResponseMemory`; 0 when it is unset).
    public var responseMemoryBytes = 0
    /// The nodes the jobs in memory hold (`NodeRoom`, bounded by `maxActiveNodes`).
    public var activeNodes = 0
    /// Coalescing, cache and rate-limit counters (API.md §9).
    public var transfer = TransferMetrics()

    public init() {}
}

/// What `Engine.retry` did.
public enum RetryOutcome: Sendable {
    /// The job runs again (or waits again for its `not_before`); durable when this is answered.
    case retrying(JobRecord)
    /// The job is pending, running or succeeded.
    case notRetryable(JobRecord)
    case notFound
    /// Too many jobs are pending or running.
    case queueFull
}

/// Why the engine refused a request.
public struct EngineError: Error, Equatable, CustomStringConvertible, Sendable {
    private enum Code: Equatable, Sendable { case badCursor, storage, invalidStoredJob, shuttingDown }
    private let code: Code
    public let message: String

    private init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// The list cursor is not one this server handed out.
    public static func badCursor(_ message: String) -> EngineError { EngineError(.badCursor, message) }
    /// The store failed.
    public static func storage(_ message: String) -> EngineError { EngineError(.storage, message) }
    /// A stored job could not be rebuilt.
    public static func invalidStoredJob(_ message: String) -> EngineError { EngineError(.invalidStoredJob, message) }

    /// The server is shutting down and changes no job any more.
    public static func shuttingDown(_ message: String) -> EngineError { EngineError(.shuttingDown, message) }

    public var isBadCursor: Bool { code == .badCursor }
    public var isShuttingDown: Bool { code == .shuttingDown }
    public var description: String { message }
}
