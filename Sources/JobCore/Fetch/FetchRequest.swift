/// How a fetch reads its response body (API.md §1.2 `expect`).
public enum FetchExpect: String, Sendable, CaseIterable {
    case auto, json, text, bytes
}

/// Whether a fetch uses the HTTP cache (API.md §9 `cache`).
public enum FetchCacheMode: String, Sendable, CaseIterable {
    case off, use
}

/// One HTTP request of a `fetch` node, as validated from the graph.
public struct FetchRequest: Equatable, Sendable {
    /// The methods a fetch may use.
    public static let methods: Set<String> = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    /// Whether `method` is idempotent unless the node says otherwise. A `switch`, not a set: every fetch node a
    /// submission validates asks, and hashing the method took 320 instructions a node, a twenty-fifth of validating
    /// a list of fetches (callgrind).
    public static func isIdempotent(_ method: String) -> Bool {
        switch method {
        case "GET", "HEAD", "PUT", "DELETE", "OPTIONS": return true
        default: return false
        }
    }

    /// The request body: a string sent as is, or a JSON value sent as `application/json`.
    public enum Body: Equatable, Sendable {
        case text(String)
        case json(JSONValue)
    }

    public var url: String
    public var method: String
    /// Header fields in the order given.
    public var headers: [(name: String, value: String)]
    public var body: Body?
    public var expect: FetchExpect
    /// Status codes that count as success besides 200–299.
    public var acceptStatus: Set<Int>
    /// Extra attempts (0–10) after a connect error, a timeout, a 5xx or a 429; only used when `idempotent`.
    public var retries: Int
    public var retryBackoffMs: Int
    public var idempotent: Bool
    /// The largest response body accepted; `nil` means the fetcher's configured limit.
    public var maxBytes: Int?
    public var followRedirects: Bool
    /// Share an identical GET or HEAD in flight instead of making another request (API.md §9).
    public var coalesce: Bool
    /// `use`: answer from the HTTP cache when RFC 9111 allows, and store what it allows (GET only).
    public var cache: FetchCacheMode

    public init(
        url: String, method: String = "GET", headers: [(name: String, value: String)] = [], body: Body? = nil,
        expect: FetchExpect = .auto, acceptStatus: Set<Int> = [], retries: Int = 0, retryBackoffMs: Int = 200,
        idempotent: Bool? = nil, maxBytes: Int? = nil, followRedirects: Bool = true, coalesce: Bool = false,
        cache: FetchCacheMode = .off
    ) {
        self.coalesce = coalesce
        self.cache = cache
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.expect = expect
        self.acceptStatus = acceptStatus
        self.retries = retries
        self.retryBackoffMs = retryBackoffMs
        self.idempotent = idempotent ?? FetchRequest.isIdempotent(method)
        self.maxBytes = maxBytes
        self.followRedirects = followRedirects
    }

    public static func == (a: FetchRequest, b: FetchRequest) -> Bool {
        a.url == b.url && a.method == b.method && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
            && a.body == b.body && a.expect == b.expect && a.acceptStatus == b.acceptStatus && a.retries == b.retries
            && a.retryBackoffMs == b.retryBackoffMs && a.idempotent == b.idempotent && a.maxBytes == b.maxBytes
            && a.followRedirects == b.followRedirects && a.coalesce == b.coalesce && a.cache == b.cache
    }
}
