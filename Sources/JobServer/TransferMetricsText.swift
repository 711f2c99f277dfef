import JobCore

extension PrometheusText {
    /// The transfer layer's families (API.md §9): rate-limit waiting, coalescing, cache outcomes.
    static func renderTransfer(_ out: inout String, _ t: TransferMetrics) {
        family(&out, "jobserver_rate_limit_wait_seconds_total", "counter",
               "Time fetches spent ready to start but held back by --host-rate.")
        sample(&out, "jobserver_rate_limit_wait_seconds_total", [], Double(t.rateLimitWaitMs) / 1000)
        family(&out, "jobserver_rate_limited_fetches_total", "counter", "Fetches held back by --host-rate before they started.")
        sample(&out, "jobserver_rate_limited_fetches_total", [], Double(t.rateLimitedFetches))
        family(&out, "jobserver_coalesced_fetches_total", "counter",
               "Fetches that shared an identical transfer in flight instead of making a request.")
        sample(&out, "jobserver_coalesced_fetches_total", [], Double(t.coalescedFetches))
        family(&out, "jobserver_cache_lookups_total", "counter", "cache: use fetches by outcome.")
        for outcome in ["hit", "revalidated", "miss"] {
            sample(&out, "jobserver_cache_lookups_total", [("outcome", outcome)], Double(t.cacheOutcomes[outcome] ?? 0))
        }
        family(&out, "jobserver_cache_bytes", "gauge", "Bytes of responses the HTTP cache holds.")
        sample(&out, "jobserver_cache_bytes", [], Double(t.cacheBytes))
        family(&out, "jobserver_cache_entries", "gauge", "Responses the HTTP cache holds.")
        sample(&out, "jobserver_cache_entries", [], Double(t.cacheEntries))
    }
}
