extension JobRun {
    /// The job's response byte budget (`--max-job-bytes`), drawing on the server's (`--max-response-memory`), or
    /// `nil` when the server sets neither. A job rebuilt after a restart starts from the response bytes its stored
    /// results hold, so the budget bounds what the job holds across restarts too.
    func makeByteBudget() -> ByteBudget? {
        let limit = engine.configuration.maxJobBytes
        let shared = engine.responseMemory
        guard limit > 0 || shared != nil else { return nil }
        return ByteBudget(limit: limit > 0 ? limit : .max, used: storedResponseBytes(), shared: shared)
    }

    /// The response body bytes the settled fetch nodes' results hold: a fetch's `bytes`, a paginated fetch's pages'
    /// `bytes` summed (or, when it gathered `items`, which keep no count, the size of its result as JSON).
    func storedResponseBytes() -> Int {
        var total = 0
        for i in nodes.indices where nodes[i].state == .succeeded {
            guard case .fetch = graph.nodes[i].kind, let result = nodes[i].result else { continue }
            if let bytes = result["bytes"]?.intValue {
                total += max(0, bytes)
            } else if let pages = result["results"]?.arrayValue {
                for page in pages { total += max(0, page["bytes"]?.intValue ?? 0) }
            } else if result["items"] != nil {
                total += result.bytes.count
            }
        }
        return total
    }

    /// Counts against the budget a response the job holds but the fetcher did not count: one shared from another
    /// fetch's transfer (`coalesce`), or read from the HTTP cache. Past the budget, the fetch fails with `too_large`
    /// as if the bytes had arrived, and its body is not kept.
    func chargeDelivered(_ i: Int, _ outcome: FetchOutcome) -> FetchOutcome {
        guard case .success(let response) = outcome.result, let budget = byteBudget else { return outcome }
        let uncounted = response.coalesced == true || response.cacheOutcome == "hit" || response.cacheOutcome == "revalidated"
        guard uncounted, let refused = budget.refusal(taking: response.bytes), case .fetch(let request) = graph.nodes[i].kind
        else { return outcome }
        let what = "\(request.method) \(nodes[i].request?["url"]?.stringValue ?? request.url)"
        return FetchOutcome(
            result: .failure(NodeError(.tooLarge, "\(what): \(refused.exceeded)")), attempts: outcome.attempts,
            lastResponse: nil, crossedBudget: true)
    }
}
