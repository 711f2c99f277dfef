/// How a fetch reads its response body (API.md §1.2 `expect`).
public enum FetchExpect: String, Sendable, CaseIterable {
    case auto, json, text, bytes
}

/// One HTTP request of a `fetch` node, as validated from the graph.
public struct FetchRequest: Equatable, Sendable {
    /// The methods a fetch may use.
    public static let methods: Set<String> = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    /// The methods that are idempotent unless the node says otherwise.
    public static let idempotentMethods: Set<String> = ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"]

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

    public init(
        url: String, method: String = "GET", headers: [(name: String, value: String)] = [], body: Body? = nil,
        expect: FetchExpect = .auto, acceptStatus: Set<Int> = [], retries: Int = 0, retryBackoffMs: Int = 200,
        idempotent: Bool? = nil, maxBytes: Int? = nil, followRedirects: Bool = true
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.expect = expect
        self.acceptStatus = acceptStatus
        self.retries = retries
        self.retryBackoffMs = retryBackoffMs
        self.idempotent = idempotent ?? FetchRequest.idempotentMethods.contains(method)
        self.maxBytes = maxBytes
        self.followRedirects = followRedirects
    }

    public static func == (a: FetchRequest, b: FetchRequest) -> Bool {
        a.url == b.url && a.method == b.method && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
            && a.body == b.body && a.expect == b.expect && a.acceptStatus == b.acceptStatus && a.retries == b.retries
            && a.retryBackoffMs == b.retryBackoffMs && a.idempotent == b.idempotent && a.maxBytes == b.maxBytes
            && a.followRedirects == b.followRedirects
    }
}
