#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The one shared, bounded queue of fetches waiting for a transfer slot.
///
/// Fetches wait here, as a few bytes each, until a slot is free both in total
/// and for their host; only then are they handed to the fetcher (where each
/// transfer costs a curl handle). Waiting fetches are grouped by host, and
/// within a host in lanes, one per job, served round-robin, so that one job's
/// fan-out of 10,000 calls neither floods an upstream nor starves other jobs.
/// A job's turn is as many fetches as the host has slots (or as it has
/// waiting, if fewer): one fetch a turn would have every job of a backlog
/// advance together and none finish until all were nearly done, while a turn
/// of a slot-full lets a small job go out whole and a large one take the host
/// only until the jobs behind it have had theirs.
/// Every limit is a host's (its slots, its rate), so finding the next fetch
/// looks at each waiting host once, however many jobs wait on it. Owned by the
/// engine's queue; not thread-safe.
struct FetchQueue {
    struct Ticket {
        var jobID: String
        var node: Int
    }

    /// One job's fetches waiting for one host, in the order they were queued.
    private struct Lane {
        var tickets: [Ticket] = []
        var head = 0
        var isEmpty: Bool { head >= tickets.count }
        var count: Int { tickets.count - head }

        mutating func pop() -> Ticket? {
            guard head < tickets.count else { return nil }
            let t = tickets[head]
            head += 1
            if head > 1024, head * 2 > tickets.count {
                tickets.removeFirst(head)
                head = 0
            }
            return t
        }
    }

    /// The fetches waiting for one host: a lane per job, taken in turn, up to `quantum` fetches a turn.
    ///
    /// A job whose lane empties keeps its (empty) lane and its place in the ring until empty places are half the
    /// ring, which is then compacted in one pass: taking one out in place would move the whole ring each time, and
    /// with thousands of jobs waiting that cost more than serving them.
    private struct HostLanes {
        var lanes: [String: Lane] = [:]
        var ring: [String] = []
        var cursor = 0
        /// Fetches the job at `cursor` has taken in its current turn.
        var turnTaken = 0
        var emptyLanes = 0
        var waiting = 0
        /// Since when (monotonic ns) the host's next fetch could start but for its rate.
        var rateBlockedSinceNs: UInt64?
        /// Whether the fetcher holds this host's fetches beyond its slots (`heldInFetcher`).
        var heldInFetcher = false

        mutating func append(_ ticket: Ticket) {
            // One lookup of the job's lane: queueing a list's fetches is a run of these.
            if let k = lanes.index(forKey: ticket.jobID) {
                if lanes.values[k].isEmpty { emptyLanes -= 1 }
                lanes.values[k].tickets.append(ticket)
            } else {
                ring.append(ticket.jobID)
                lanes[ticket.jobID] = Lane(tickets: [ticket])
            }
            waiting += 1
        }

        /// The oldest fetch of the job whose turn it is; the turn passes to the next job after `quantum` fetches,
        /// or when the job has none left.
        mutating func pop(quantum: Int) -> Ticket? {
            guard waiting > 0 else { return nil }
            for _ in 0...ring.count {
                if cursor >= ring.count { cursor = 0 }
                // One lookup of the job's lane, popped in place through its index.
                guard let k = lanes.index(forKey: ring[cursor]), let ticket = lanes.values[k].pop() else {
                    cursor += 1
                    turnTaken = 0
                    continue
                }
                waiting -= 1
                turnTaken += 1
                if lanes.values[k].isEmpty {
                    lanes.values[k] = Lane()
                    emptyLanes += 1
                    cursor += 1
                    turnTaken = 0
                    compactIfSparse()
                } else if turnTaken >= quantum {
                    cursor += 1
                    turnTaken = 0
                }
                return ticket
            }
            return nil
        }

        private mutating func compactIfSparse() {
            guard emptyLanes > 64, emptyLanes * 2 > ring.count else { return }
            var kept: [String] = []
            kept.reserveCapacity(ring.count - emptyLanes)
            var keptBeforeCursor = 0
            for (k, job) in ring.enumerated() {
                guard let lane = lanes[job], !lane.isEmpty else {
                    lanes[job] = nil
                    // The job in its turn is gone: the next one's turn begins.
                    if k == cursor { turnTaken = 0 }
                    continue
                }
                if k < cursor { keptBeforeCursor += 1 }
                kept.append(job)
            }
            ring = kept
            cursor = keptBeforeCursor
            emptyLanes = 0
        }

        /// Empties the job's lane; how many fetches it held.
        mutating func remove(job: String) -> Int {
            guard let lane = lanes[job], !lane.isEmpty else { return 0 }
            lanes[job] = Lane()
            emptyLanes += 1
            waiting -= lane.count
            compactIfSparse()
            return lane.count
        }
    }

    let maxTotal: Int
    let maxPerHost: Int
    /// How many fetches a plain-HTTP host without a rate may be handed beyond its slots (0: none). The fetcher
    /// holds them (`Fetcher.plainHTTPTransfersPerHost`) and starts one the moment a transfer to the host ends, in
    /// its own loop, instead of the engine's queue giving the freed slot out a hop later: with every slot of a
    /// host busy, that hop is what bounds its rate. Such a fetch is running from the moment it is handed over.
    let heldInFetcher: Int
    /// Of `inFlight`, the fetches handed over beyond their host's slots: the transfers that may run at once are
    /// the rest, which `maxTotal` bounds.
    private(set) var heldBeyondSlots = 0
    /// Hosts with fetches waiting, and the order they are served in.
    private var hosts: [String: HostLanes] = [:]
    private var hostRing: [String] = []
    private var cursor = 0
    private var hostInFlight: [String: Int] = [:]
    private(set) var inFlight = 0
    private(set) var waiting = 0
    /// `--host-rate`: consulted after the slot limits, so a start takes a token only when it happens.
    var rateLimiter = HostRateLimiter([])
    /// When the earliest fetch held back by a rate may start (monotonic ns); `nil` when none is.
    private(set) var rateDueNs: UInt64?
    /// Time fetches spent ready to start but held back by `--host-rate`, and how many were.
    private(set) var rateWaitNs: UInt64 = 0
    private(set) var rateLimitedStarts = 0

    /// Counts a start held back `ns` by a rate booked in the shared store (`SharedHostRates`).
    mutating func rateWaited(ns: UInt64) {
        guard ns > 0 else { return }
        rateWaitNs += ns
        rateLimitedStarts += 1
    }

    init(maxTotal: Int, maxPerHost: Int, heldInFetcher: Int = 0) {
        self.maxTotal = max(1, maxTotal)
        self.maxPerHost = max(1, maxPerHost)
        self.heldInFetcher = max(0, heldInFetcher)
    }

    mutating func enqueue(_ ticket: Ticket, host: String) {
        if hosts[host] == nil {
            hostRing.append(host)
            var lanes = HostLanes()
            // A rate counts starts when they are handed over, so a host with one is never handed more than its slots.
            lanes.heldInFetcher = heldInFetcher > 0 && host.hasPrefix("http://") && rateLimiter.perSecond(hostKey: host) == nil
            hosts[host] = lanes
        }
        hosts[host]?.append(ticket)
        waiting += 1
    }

    /// The next ticket that may start now, with its host; its slot is taken.
    mutating func next() -> (Ticket, String)? {
        rateDueNs = nil
        guard inFlight - heldBeyondSlots < maxTotal, !hostRing.isEmpty else { return nil }
        let now: UInt64 = rateLimiter.isEmpty || rateLimiter.booksInStore ? 0 : HostRateLimiter.nowNs()
        var tried = 0
        while tried < hostRing.count {
            if cursor >= hostRing.count { cursor = 0 }
            let host = hostRing[cursor]
            // The host's lanes are found once and then read and changed in place through their index (no insertion
            // or removal in `hosts` comes between): a lookup by key hashes the host's name each time, and finding a
            // fetch took six of them, 3,000 instructions per fetch (callgrind).
            guard let k = hosts.index(forKey: host), hosts.values[k].waiting > 0 else {
                hosts[host] = nil
                hostRing.remove(at: cursor)
                continue
            }
            let slots = hostInFlight.index(forKey: host)
            let inFlightHere = slots.map { hostInFlight.values[$0] } ?? 0
            let beyondSlots = inFlightHere >= maxPerHost
            guard !beyondSlots || (inFlightHere < maxPerHost + heldInFetcher && hosts.values[k].heldInFetcher) else {
                cursor += 1
                tried += 1
                continue
            }
            if let due = rateLimiter.take(hostKey: host, nowNs: now) {
                rateDueNs = min(rateDueNs ?? due, due)
                if hosts.values[k].rateBlockedSinceNs == nil { hosts.values[k].rateBlockedSinceNs = now }
                cursor += 1
                tried += 1
                continue
            }
            if let since = hosts.values[k].rateBlockedSinceNs {
                rateWaitNs += now > since ? now - since : 0
                rateLimitedStarts += 1
                hosts.values[k].rateBlockedSinceNs = nil
            }
            guard let ticket = hosts.values[k].pop(quantum: maxPerHost) else { continue }
            waiting -= 1
            inFlight += 1
            if let slots { hostInFlight.values[slots] = inFlightHere + 1 } else { hostInFlight[host] = 1 }
            if beyondSlots { heldBeyondSlots += 1 }
            if hosts.values[k].waiting == 0 {
                hosts[host] = nil
                hostRing.remove(at: cursor)
            } else {
                cursor += 1
            }
            return (ticket, host)
        }
        return nil
    }

    /// Gives back the slot of a finished fetch.
    mutating func finished(host: String) {
        inFlight -= 1
        guard let slots = hostInFlight.index(forKey: host) else { return }
        let n = hostInFlight.values[slots] - 1
        if n > 0 { hostInFlight.values[slots] = n } else { hostInFlight.remove(at: slots) }
        if n >= maxPerHost { heldBeyondSlots -= 1 }
    }

    /// Drops every waiting ticket of a job.
    mutating func removeJob(_ jobID: String) {
        for host in hostRing {
            waiting -= hosts[host]?.remove(job: jobID) ?? 0
        }
    }

    /// Whether `hostKey(of: url)` is `key` without working it out: true when `url` is `key` followed by the end of
    /// the authority (`/`, `?`, `#` or nothing). A key is lowercase and has no userinfo, so such a URL's scheme and
    /// authority are the key's own.
    static func url(_ url: String, hasHostKey key: String) -> Bool {
        guard !key.isEmpty else { return false }
        // Compared as bytes in place: `starts(with:)` over the two UTF-8 views took 1,400 instructions a fetch.
        return url.withUTF8InPlace { url in
            key.withUTF8InPlace { key in
                guard url.count >= key.count, let u = url.baseAddress, let k = key.baseAddress,
                    memcmp(u, k, key.count) == 0
                else { return false }
                guard url.count > key.count else { return true }
                let next = url[key.count]
                return next == UInt8(ascii: "/") || next == UInt8(ascii: "?") || next == UInt8(ascii: "#")
            }
        }
    }

    /// `scheme://host:port` of a URL, lowercased: the unit of the per-host limit.
    ///
    /// Found in the URL's UTF-8 bytes: it is taken once per fetch, and Foundation's `range(of:)` cost more than the
    /// rest of queueing one.
    static func hostKey(of url: String) -> String {
        let bytes = url.utf8
        // The first `://`, by hand: the generic `firstRange(of:)` cost as much as the Foundation search did.
        var schemeEnd: Range<String.UTF8View.Index>?
        var i = bytes.startIndex
        while i < bytes.endIndex, schemeEnd == nil {
            let next = bytes.index(after: i)
            if bytes[i] == UInt8(ascii: ":"), next < bytes.endIndex, bytes[next] == UInt8(ascii: "/") {
                let third = bytes.index(after: next)
                if third < bytes.endIndex, bytes[third] == UInt8(ascii: "/") { schemeEnd = i..<bytes.index(after: third) }
            }
            i = next
        }
        guard let schemeEnd else { return url }
        let rest = bytes[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") }
        let authority = rest[..<(authorityEnd ?? rest.endIndex)]
        // The last part between `@`s that is not empty: userinfo is not part of the key.
        var hostPort = authority
        var segmentStart = authority.startIndex
        i = authority.startIndex
        while i < authority.endIndex {
            let next = authority.index(after: i)
            if authority[i] == UInt8(ascii: "@") {
                if segmentStart < i { hostPort = authority[segmentStart..<i] }
                segmentStart = next
            }
            i = next
        }
        if segmentStart < authority.endIndex { hostPort = authority[segmentStart...] }
        var key = String(decoding: bytes[..<schemeEnd.lowerBound], as: UTF8.self)
        key += "://"
        key += String(decoding: hostPort, as: UTF8.self)
        return key.lowercased()
    }
}
