/// The state of a node, and of a job (a job's state is its root's).
public enum NodeState: String, Sendable, CaseIterable {
    case pending, running, succeeded, failed, cancelled, skipped

    /// True once the node can change no more.
    public var isSettled: Bool {
        switch self {
        case .pending, .running: return false
        case .succeeded, .failed, .cancelled, .skipped: return true
        }
    }
}

/// How many nodes of a job are in each state (API.md §1.4).
public struct Progress: Equatable, Sendable {
    public var total = 0
    public var pending = 0
    public var running = 0
    public var succeeded = 0
    public var failed = 0
    public var cancelled = 0
    public var skipped = 0

    public init() {}

    /// Settled nodes.
    public var done: Int { succeeded + failed + cancelled + skipped }

    /// `done` as a percentage of `total`, one decimal.
    public var percent: Double {
        guard total > 0 else { return 0 }
        return (Double(done) * 1000 / Double(total)).rounded() / 10
    }

    /// Moves one node from one state's count to another's.
    public mutating func move(from old: NodeState?, to new: NodeState) {
        if let old { self[old] -= 1 } else { total += 1 }
        self[new] += 1
    }

    public subscript(state: NodeState) -> Int {
        get {
            switch state {
            case .pending: return pending
            case .running: return running
            case .succeeded: return succeeded
            case .failed: return failed
            case .cancelled: return cancelled
            case .skipped: return skipped
            }
        }
        set {
            switch state {
            case .pending: pending = newValue
            case .running: running = newValue
            case .succeeded: succeeded = newValue
            case .failed: failed = newValue
            case .cancelled: cancelled = newValue
            case .skipped: skipped = newValue
            }
        }
    }
}

/// A job as stored: everything `GET /v1/jobs/{id}` shows, plus the submitted
/// request it was built from. Times are milliseconds since the Unix epoch.
public struct JobRecord: Equatable, Sendable {
    public var id: String
    public var name: String?
    public var state: NodeState
    public var createdAt: Int64
    public var startedAt: Int64?
    public var finishedAt: Int64?
    /// The submitted body of `POST /v1/jobs`, as received; the graph is rebuilt from it on restart.
    public var request: JSONValue
    public var metadata: JSONValue?
    public var deadlineMs: Int?
    public var result: JSONValue?
    public var error: NodeError?
    public var version: Int64
    public var progress: Progress
    /// The job's `input` (API.md §6.1), kept apart from `request` so that reads without the request show it.
    public var input: JSONValue? = nil
    /// Scheduling (API.md §8): the time the job may start, or `nil`.
    public var notBefore: Int64? = nil
    /// While the job waits in the store for `notBefore`: that time; `nil` once the engine has taken it in.
    public var dueAt: Int64? = nil
    /// At most `concurrencyLimit` running jobs share this key (API.md §8).
    public var concurrencyKey: String? = nil
    public var concurrencyLimit: Int? = nil
    /// Runs of the job: 1, then one more at each retry.
    public var attempt = 1
    /// When the latest retry began, or `nil`: the deadline counts from then.
    public var retriedAt: Int64? = nil
    /// Not stored: the job's place in its concurrency key's queue while it waits there (1 = next).
    public var queuePosition: Int? = nil
    /// The `notify` webhook's delivery (API.md §8), when read from the outbox; `nil` for a live record, whose
    /// delivery is pending if its request has a `notify`.
    public var notify: NotifyStatus? = nil
    /// Storage only: where the store may take `result` from rather than write it again (the root's result).
    public var resultSource: ResultSource? = nil

    public init(
        id: String, name: String? = nil, state: NodeState = .pending, createdAt: Int64, startedAt: Int64? = nil,
        finishedAt: Int64? = nil, request: JSONValue, metadata: JSONValue? = nil, deadlineMs: Int? = nil,
        result: JSONValue? = nil, error: NodeError? = nil, version: Int64 = 1, progress: Progress = Progress()
    ) {
        self.id = id
        self.name = name
        self.state = state
        self.createdAt = createdAt
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.request = request
        self.metadata = metadata
        self.deadlineMs = deadlineMs
        self.result = result
        self.error = error
        self.version = version
        self.progress = progress
    }
}

/// A node as stored (API.md §2, `GET /v1/jobs/{id}/nodes`).
///
/// A job of 100,000 nodes holds one record per node in memory, and a copy of each change queued for the store, so
/// the record is kept small (200 bytes, where plain optionals made it 304): its optional numbers are stored as one
/// word each, `Int64.min` standing for `nil`, and its error, which few nodes have, in a box.
public struct NodeRecord: Equatable, Sendable {
    public var jobID: String
    public var id: String
    /// The parent's id; `nil` for the root.
    public var parent: String?
    /// Position in tree (pre-)order, the root at 0.
    public var position: Int
    /// `fetch`, `list` or `sequence`.
    public var type: String
    public var state: NodeState
    public var recovered: Bool
    public var attempts: Int
    public var startedAt: Int64? {
        get { Self.unpack(startedAtWord) }
        set { startedAtWord = Self.pack(newValue) }
    }
    public var finishedAt: Int64? {
        get { Self.unpack(finishedAtWord) }
        set { finishedAtWord = Self.pack(newValue) }
    }
    public var elapsedMs: Int? {
        get { Self.unpack(elapsedMsWord).map(Int.init) }
        set { elapsedMsWord = Self.pack(newValue.map(Int64.init)) }
    }
    /// The HTTP status of a fetch's last response.
    public var status: Int? {
        get { Self.unpack(statusWord).map(Int.init) }
        set { statusWord = Self.pack(newValue.map(Int64.init)) }
    }
    public var error: NodeError? {
        get { errorBox?.error }
        set { errorBox = newValue.map(ErrorBox.init) }
    }
    public var result: JSONValue?
    /// For a fetch that has started: the request it sent, credentials included (API.md §6.3; see `RequestRecord`).
    public var request: JSONValue? = nil
    /// For a paginated fetch that has started: the pages fetched so far (API.md §7.2).
    public var pages: Int? {
        get { Self.unpack(pagesWord).map(Int.init) }
        set { pagesWord = Self.pack(newValue.map(Int64.init)) }
    }
    /// Storage only: where the store may take `result` from rather than write it again (its children's results,
    /// or the stored response body); set by the engine when the node succeeds, read back from `result_ref`.
    public var resultSource: ResultSource? = nil

    private var startedAtWord = Int64.min
    private var finishedAtWord = Int64.min
    private var elapsedMsWord = Int64.min
    private var statusWord = Int64.min
    private var pagesWord = Int64.min
    private var errorBox: ErrorBox?

    public init(
        jobID: String, id: String, parent: String?, position: Int, type: String, state: NodeState = .pending,
        attempts: Int = 0, startedAt: Int64? = nil, finishedAt: Int64? = nil, elapsedMs: Int? = nil,
        status: Int? = nil, error: NodeError? = nil, recovered: Bool = false, result: JSONValue? = nil
    ) {
        self.jobID = jobID
        self.id = id
        self.parent = parent
        self.position = position
        self.type = type
        self.state = state
        self.recovered = recovered
        self.attempts = attempts
        self.result = result
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.elapsedMs = elapsedMs
        self.status = status
        self.error = error
    }

    /// `Int64.min` is no time, duration, status or count a node records; it stands for `nil`.
    private static func pack(_ value: Int64?) -> Int64 { value ?? .min }
    private static func unpack(_ word: Int64) -> Int64? { word == .min ? nil : word }

    /// A node's error, shared by the copies of its record; compared by value.
    private final class ErrorBox: Equatable, Sendable {
        let error: NodeError
        init(_ error: NodeError) { self.error = error }
        static func == (a: ErrorBox, b: ErrorBox) -> Bool { a === b || a.error == b.error }
    }
}

/// A fetch node's raw response body, kept for `GET …/nodes/{node}/body`.
public struct StoredBody: Equatable, Sendable {
    public var contentType: String?
    public var bytes: [UInt8]

    public init(contentType: String?, bytes: [UInt8]) {
        self.contentType = contentType
        self.bytes = bytes
    }
}
