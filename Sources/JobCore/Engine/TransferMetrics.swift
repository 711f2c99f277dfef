/// The transfer layer's counters for `/metrics` (API.md §9).
public struct TransferMetrics: Sendable, Equatable {
    /// Time fetches spent ready to start but held back by `--host-rate`, in ms.
    public var rateLimitWaitMs = 0
    /// Fetches that were held back by `--host-rate` before they started.
    public var rateLimitedFetches = 0
    /// Fetches that shared another fetch's transfer instead of making a request (`"coalesced": true`).
    public var coalescedFetches = 0
    /// `cache: "use"` fetches by outcome: `hit`, `revalidated`, `miss`.
    public var cacheOutcomes: [String: Int] = [:]
    /// Bytes and entries the HTTP cache holds.
    public var cacheBytes = 0
    public var cacheEntries = 0

    public init() {}
}
