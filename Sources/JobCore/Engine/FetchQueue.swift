/// The one shared, bounded queue of fetches waiting for a transfer slot.
///
/// Fetches wait here, as a few bytes each, until a slot is free both in total
/// and for their host; only then are they handed to the fetcher (where each
/// transfer costs a curl handle). Waiting fetches are grouped in lanes, one per
/// (job, host), served round-robin, so that one job's fan-out of 10,000 calls
/// neither floods an upstream nor starves other jobs. Owned by the engine's
/// queue; not thread-safe.
struct FetchQueue {
    struct Ticket {
        var jobID: String
        var node: Int
    }

    private struct LaneKey: Hashable {
        var jobID: String
        var host: String
    }

    private struct Lane {
        var tickets: [Ticket] = []
        var head = 0
        /// Since when (monotonic ns) the head ticket could start but for its host's rate.
        var rateBlockedSinceNs: UInt64?
        var isEmpty: Bool { head >= tickets.count }

        mutating func pop() -> Ticket? {
            guard head < tickets.count else { return nil }
            let t = tickets[head]
            head += 1
            rateBlockedSinceNs = nil
            if head > 1024, head * 2 > tickets.count {
                tickets.removeFirst(head)
                head = 0
            }
            return t
        }
    }

    let maxTotal: Int
    let maxPerHost: Int
    private var lanes: [LaneKey: Lane] = [:]
    private var ring: [LaneKey] = []
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

    init(maxTotal: Int, maxPerHost: Int) {
        self.maxTotal = max(1, maxTotal)
        self.maxPerHost = max(1, maxPerHost)
    }

    mutating func enqueue(_ ticket: Ticket, host: String) {
        let key = LaneKey(jobID: ticket.jobID, host: host)
        if lanes[key] == nil {
            lanes[key] = Lane()
            ring.append(key)
        }
        lanes[key]?.tickets.append(ticket)
        waiting += 1
    }

    /// The next ticket that may start now, with its host; its slot is taken.
    mutating func next() -> (Ticket, String)? {
        rateDueNs = nil
        guard inFlight < maxTotal, !ring.isEmpty else { return nil }
        let now: UInt64 = rateLimiter.isEmpty || rateLimiter.booksInStore ? 0 : HostRateLimiter.nowNs()
        var tried = 0
        while tried < ring.count {
            if cursor >= ring.count { cursor = 0 }
            let key = ring[cursor]
            guard var lane = lanes[key], !lane.isEmpty else {
                lanes[key] = nil
                ring.remove(at: cursor)
                continue
            }
            guard hostInFlight[key.host, default: 0] < maxPerHost else {
                cursor += 1
                tried += 1
                continue
            }
            if let due = rateLimiter.take(hostKey: key.host, nowNs: now) {
                rateDueNs = min(rateDueNs ?? due, due)
                if lane.rateBlockedSinceNs == nil { lanes[key]?.rateBlockedSinceNs = now }
                cursor += 1
                tried += 1
                continue
            }
            if let since = lane.rateBlockedSinceNs {
                rateWaitNs += now > since ? now - since : 0
                rateLimitedStarts += 1
            }
            if let ticket = lane.pop() {
                waiting -= 1
                inFlight += 1
                hostInFlight[key.host, default: 0] += 1
                if lane.isEmpty {
                    lanes[key] = nil
                    ring.remove(at: cursor)
                } else {
                    lanes[key] = lane
                    cursor += 1
                }
                return (ticket, key.host)
            }
            cursor += 1
            tried += 1
        }
        return nil
    }

    /// Gives back the slot of a finished fetch.
    mutating func finished(host: String) {
        inFlight -= 1
        let n = hostInFlight[host, default: 1] - 1
        hostInFlight[host] = n > 0 ? n : nil
    }

    /// Drops every waiting ticket of a job.
    mutating func removeJob(_ jobID: String) {
        var kept: [LaneKey] = []
        for key in ring {
            if key.jobID == jobID {
                if let lane = lanes[key] { waiting -= lane.tickets.count - lane.head }
                lanes[key] = nil
            } else {
                kept.append(key)
            }
        }
        ring = kept
        cursor = 0
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
