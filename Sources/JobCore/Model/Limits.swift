/// Every depth and size limit a job body is held to, in one place (API.md §1.2 and §4).
///
/// Three of them are set by the operator (`--max-nodes`, `--max-depth`, `--max-response-bytes`); the rest are
/// fixed by the API. The JSON nesting limits are derived from the graph depth, so that no body the validator would
/// accept can be refused by the parser first, and so that whatever was stored under any allowed `--max-depth` can
/// always be parsed again. The HTTP body size (`--max-request-bytes`) belongs to the HTTP layer and is not here.
public struct Limits: Equatable, Sendable {
    /// Most nodes in one job (`--max-nodes`).
    public var maxNodes = 10_000
    /// Deepest nesting of nodes; the root is depth 1 (`--max-depth`).
    public var maxDepth = 64
    /// The server's per-fetch response limit (`--max-response-bytes`); a fetch's `max_bytes` must be 0...this.
    public var maxResponseBytes = 10 * 1024 * 1024

    /// The server's defaults (API.md §4).
    public init() {}

    /// Limits other than the defaults.
    public init(maxNodes: Int = 10_000, maxDepth: Int = 64, maxResponseBytes: Int = 10 * 1024 * 1024) {
        self.maxNodes = maxNodes
        self.maxDepth = maxDepth
        self.maxResponseBytes = maxResponseBytes
    }

    // MARK: - What the operator may choose

    /// Largest `--max-nodes`.
    public static let maxNodesCeiling = 10_000_000
    /// Largest `--max-depth`. The engine starts a node's children from inside the node's own start, one stack frame
    /// pair per level on its queue's thread (8 MiB): a release build ran 7,500 levels and crashed at 10,000, the
    /// flag's old bound. This keeps twice that margin; it can rise once starting a graph no longer recurses.
    public static let maxDepthCeiling = 4_000

    // MARK: - Fixed by the API

    /// `name`, in Unicode scalars.
    public static let maxNameScalars = 200
    /// `timeout_ms` and `deadline_ms` (one day).
    public static let maxTimeoutMs = 86_400_000
    /// `retries` of a fetch.
    public static let maxRetries = 10
    /// `retry_backoff_ms` of a fetch.
    public static let maxRetryBackoffMs = 60_000
    /// `metadata`, as compact JSON text.
    public static let maxMetadataBytes = 16 * 1024
    /// An explicit node `id`, in bytes.
    public static let maxIDLength = 64
    /// A fetch `url`, in bytes.
    public static let maxURLBytes = 8192
    /// A list's `concurrency` (API.md only says ≥ 1; a bound keeps it an `Int`).
    public static let maxConcurrency = 1_000_000
    /// Nesting of a JSON response body that a fetch parses (`expect: json`).
    public static let responseJSONDepth = 512

    // MARK: - Derived

    /// How deep a request body's JSON may nest. A node at graph depth `d` sits at JSON level `2d` (an object
    /// inside a `children` array inside its parent), and a fetch's `json` body or a `recover` value nests further
    /// below it, so this leaves as much room again, and never less than 512.
    public var requestJSONDepth: Int { Swift.max(512, 4 * maxDepth + 16) }

    /// How deep any JSON the store wrote may nest: a request accepted under the largest `--max-depth`, or a result
    /// that wraps a response body in one array per graph level. It does not follow the current flags, so that a
    /// job stored under a larger `--max-depth` is read back after a restart with a smaller one. The parser keeps
    /// its own stack, so the bound is about work on a damaged file, not about the thread's stack.
    public static let storedJSONDepth =
        Limits(maxDepth: maxDepthCeiling).requestJSONDepth + maxDepthCeiling + responseJSONDepth

    /// The limits a stored job is rebuilt under after a restart: it was validated when it was accepted, under the
    /// flags of that run, so the operator's node, depth and response caps of this run must not refuse it now.
    /// Everything the API itself fixes (field ranges, id syntax, URL rules) is still checked, and the walk still
    /// keeps its own stack.
    public var forStoredJobs: Limits {
        Limits(maxNodes: Limits.maxNodesCeiling, maxDepth: Limits.maxDepthCeiling, maxResponseBytes: Int.max)
    }
}

/// The name the graph validator has always used for its limits.
public typealias GraphLimits = Limits
