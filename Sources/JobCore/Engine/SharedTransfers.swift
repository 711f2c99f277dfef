/// Identical GET and HEAD transfers in flight, shared by every node that asks for one with `coalesce`
/// (API.md §9), the way MKNetworkKit hands one in-flight request to everyone who asks for the same resource.
///
/// Two fetches are identical when their method, URL and header fields (in order) match, and so do the options
/// that change what the transfer does or how its answer is judged: `expect`, `accept_status`, `max_bytes`,
/// `follow_redirects`, `retries` and `retry_backoff_ms`. A fetch joins a transfer when the fetch queue gives it
/// a slot, and gives the slot straight back; the transfer keeps the slot of the fetch that started it until it
/// ends, even if that fetch is cancelled meanwhile. The transfer is aborted only when its last sharer leaves.
/// Owned by the engine's queue.
final class SharedTransfers: @unchecked Sendable {
    // @unchecked: every property (and every `Flight`) is read and changed only on the engine's `queue`; the
    // completion `begin` hands to `start` is called on that queue (its contract), the fetcher's thread only holds it.
    struct Key: Hashable {
        var method: String
        var url: String
        var headers: [String]
        var expect: String
        var acceptStatus: [Int]
        var maxBytes: Int?
        var followRedirects: Bool
        var retries: Int
        var retryBackoffMs: Int

        init(_ r: FetchRequest) {
            method = r.method
            url = r.url
            headers = r.headers.map { "\($0.name): \($0.value)" }
            expect = r.expect.rawValue
            acceptStatus = r.acceptStatus.sorted()
            maxBytes = r.maxBytes
            followRedirects = r.followRedirects
            retries = r.retries
            retryBackoffMs = r.retryBackoffMs
        }
    }

    private struct Member: Hashable {
        var run: ObjectIdentifier
        var node: Int
    }

    private struct Sharer {
        weak var run: JobRun?
        var node: Int
        /// It joined a transfer another fetch started.
        var joined: Bool
        /// Takes the outcome instead of the node (the cache does, to store it first).
        var deliver: ((FetchOutcome) -> Void)?
    }

    private final class Flight: @unchecked Sendable {
        // @unchecked: as `SharedTransfers`, touched only on the engine's queue.
        let key: Key
        var handle: FetchHandle?
        var sharers: [Sharer] = []
        var done = false
        init(key: Key) { self.key = key }
    }

    private var flights: [Key: Flight] = [:]
    private var members: [Member: Flight] = [:]
    /// Fetches that joined a transfer instead of making a request.
    private(set) var coalescedCount = 0

    /// Transfers in flight that can still be joined.
    var inFlight: Int { flights.count }

    /// Node `node` of `run` has a transfer slot: it joins an identical transfer in flight (giving the slot back
    /// through `releaseSlot`), or starts one with `start`, which gets the completion to call on the engine's
    /// queue once the transfer ends.
    func begin(
        _ request: FetchRequest, run: JobRun, node: Int, deliver: ((FetchOutcome) -> Void)? = nil,
        releaseSlot: () -> Void, start: (@escaping @Sendable (FetchOutcome) -> Void) -> FetchHandle
    ) {
        let key = Key(request)
        let member = Member(run: ObjectIdentifier(run), node: node)
        if let flight = flights[key] {
            flight.sharers.append(Sharer(run: run, node: node, joined: true, deliver: deliver))
            members[member] = flight
            coalescedCount += 1
            releaseSlot()
            return
        }
        let flight = Flight(key: key)
        flight.sharers.append(Sharer(run: run, node: node, joined: false, deliver: deliver))
        flights[key] = flight
        members[member] = flight
        flight.handle = start { [weak self] outcome in self?.finish(flight, outcome) }
    }

    /// The node no longer wants its result (cancelled, timed out, its job stopping): the transfer is aborted
    /// when no sharer is left.
    func leave(run: JobRun, node: Int) {
        guard let flight = members.removeValue(forKey: Member(run: ObjectIdentifier(run), node: node)) else { return }
        flight.sharers.removeAll { $0.run === run && $0.node == node }
        guard flight.sharers.isEmpty, !flight.done else { return }
        if flights[flight.key] === flight { flights[flight.key] = nil }
        flight.handle?.cancel()
    }

    /// Every node of `run` leaves.
    func leaveAll(run: JobRun) {
        let id = ObjectIdentifier(run)
        for member in members.keys where member.run == id { leave(run: run, node: member.node) }
    }

    private func finish(_ flight: Flight, _ outcome: FetchOutcome) {
        flight.done = true
        if flights[flight.key] === flight { flights[flight.key] = nil }
        let sharers = flight.sharers
        flight.sharers = []
        for sharer in sharers {
            guard let run = sharer.run else { continue }
            members[Member(run: ObjectIdentifier(run), node: sharer.node)] = nil
            let shared = outcome.markedCoalesced(sharer.joined)
            if let deliver = sharer.deliver { deliver(shared) } else { run.fetchFinished(sharer.node, shared) }
        }
    }
}

extension FetchOutcome {
    /// The outcome as a sharer of a transfer sees it: its response says whether it joined another's transfer.
    func markedCoalesced(_ joined: Bool) -> FetchOutcome {
        var copy = self
        if case .success(var response) = copy.result {
            response.coalesced = joined
            copy.result = .success(response)
        }
        copy.lastResponse?.coalesced = joined
        return copy
    }
}
