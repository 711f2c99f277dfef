extension JobRun {
    /// Starts or joins a coalesced transfer for fetch node `i`, which holds a slot of `host` (API.md §9).
    func beginSharedTransfer(_ i: Int, _ request: FetchRequest, host: String) {
        let engine = self.engine
        engine.sharedTransfers.begin(
            request, run: self, node: i,
            releaseSlot: { engine.fetchFinished(host: host) },
            start: { finish in
                engine.fetcher.start(request, timeoutMs: nil) { outcome in
                    engine.queue.async {
                        engine.fetchFinished(host: host)
                        finish(outcome)
                    }
                }
            })
    }
}
