extension JobRun {
    /// Starts or joins a coalesced transfer for fetch node `i`, which holds a slot of `host` (API.md §9).
    /// - Parameter deliver: takes the outcome instead of the node.
    func beginSharedTransfer(_ i: Int, _ request: FetchRequest, host: String, deliver: ((FetchOutcome) -> Void)? = nil) {
        let engine = self.engine
        let budget = byteBudget
        engine.sharedTransfers.begin(
            request, run: self, node: i, deliver: deliver,
            releaseSlot: { engine.fetchFinished(host: host) },
            start: { finish in
                engine.fetcher.start(request, timeoutMs: nil, budget: budget) { outcome in
                    engine.fetchEnded(slotOf: host) { finish(outcome) }
                }
            })
    }

    private func cacheKey(_ i: Int) -> String { "\(id)/\(i)" }

    /// Fetch node `i` (every node when `nil`) no longer wants its answer: it leaves a shared transfer (aborted if
    /// it was the last sharer) and drops the request a conditional one stood in for.
    func leaveTransferLayer(_ i: Int? = nil) {
        if let i {
            engine.sharedTransfers.leave(run: self, node: i)
            engine.cacheOriginals[cacheKey(i)] = nil
        } else {
            engine.sharedTransfers.leaveAll(run: self)
            let prefix = "\(id)/"
            for key in engine.cacheOriginals.keys where key.hasPrefix(prefix) { engine.cacheOriginals[key] = nil }
        }
    }

    /// A `cache: "use"` fetch looks in the cache before it queues: a fresh response settles it without a request
    /// (and without a transfer slot or a `--host-rate` token); a stale one with validators queues a conditional
    /// request in its place; otherwise it queues as it is.
    func lookUpCache(_ i: Int, _ request: FetchRequest, _ cache: HTTPCache) {
        let engine = self.engine
        cache.lookup(request) { [weak self] lookup in
            let weakRun = self
            engine.queue.async {
                guard let run = weakRun, !run.stopping, let d = run.deferreds[i], !d.isCalled else { return }
                switch lookup {
                case .fresh(let outcome):
                    run.nodes[i].request = RequestRecord.json(request, keepBody: false)
                    run.markRunning(i)
                    run.fetchFinished(i, outcome)
                case .revalidate(let conditional):
                    engine.cacheOriginals[run.cacheKey(i)] = request
                    run.resolvedRequests[i] = conditional
                    engine.enqueueFetch(run: run, node: i, host: run.hostKey(of: request.url))
                case .absent:
                    engine.enqueueFetch(run: run, node: i, host: run.hostKey(of: request.url))
                }
            }
        }
    }

    /// Sends a `cache: "use"` fetch's request (coalesced if it asks), and lets the cache take the outcome before
    /// the node does.
    func beginCachedTransfer(_ i: Int, _ sent: FetchRequest, host: String, cache: HTTPCache) {
        let engine = self.engine
        let original = engine.cacheOriginals.removeValue(forKey: cacheKey(i)) ?? sent
        let requestTimeMs = Timestamp.nowMs()
        let deliver: @Sendable (FetchOutcome) -> Void = { [weak self] outcome in
            let run = self
            cache.absorb(original: original, sent: sent, requestTimeMs: requestTimeMs, outcome: outcome) { final in
                engine.queue.async { run?.fetchFinished(i, final) }
            }
        }
        if sent.coalesce {
            beginSharedTransfer(i, sent, host: host, deliver: deliver)
            return
        }
        transfers[i] = engine.fetcher.start(sent, timeoutMs: nil, budget: byteBudget) { outcome in
            engine.fetchEnded(slotOf: host) { deliver(outcome) }
        }
    }
}
