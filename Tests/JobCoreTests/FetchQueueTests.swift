import XCTest
@testable import JobCore

/// The shared fetch queue on its own: limits, turns between jobs and hosts, dropping a job.
final class FetchQueueTests: XCTestCase {
    private func ticket(_ job: String, _ node: Int) -> FetchQueue.Ticket { FetchQueue.Ticket(jobID: job, node: node) }

    private func drain(_ queue: inout FetchQueue) -> [String] {
        var taken: [String] = []
        for _ in 0..<1_000 {
            guard let (t, host) = queue.next() else { break }
            taken.append("\(t.jobID).\(t.node)@\(host)")
        }
        return taken
    }

    /// Takes fetches one at a time (at most `count`), each finished before the next is taken.
    private func serve(_ queue: inout FetchQueue, count: Int = 10_000) -> [String] {
        var taken: [String] = []
        for _ in 0..<count {
            guard let (t, host) = queue.next() else { break }
            taken.append("\(t.jobID).\(t.node)")
            queue.finished(host: host)
        }
        return taken
    }

    func testJobsOnOneHostTakeTurns() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 2)
        for n in 0..<5 { queue.enqueue(ticket("a", n), host: "h") }
        for n in 0..<3 { queue.enqueue(ticket("b", n), host: "h") }
        XCTAssertEqual(queue.waiting, 8)
        XCTAssertEqual(serve(&queue), ["a.0", "a.1", "b.0", "b.1", "a.2", "a.3", "b.2", "a.4"], "two a turn: the host's slots")
        XCTAssertEqual(queue.waiting, 0)
        XCTAssertEqual(queue.inFlight, 0)
    }

    func testASmallJobGoesOutWholeAndALargeOnePassesItsTurn() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 4)
        for n in 0..<10 { queue.enqueue(ticket("big", n), host: "h") }
        for job in ["s1", "s2"] { for n in 0..<3 { queue.enqueue(ticket(job, n), host: "h") } }
        XCTAssertEqual(
            serve(&queue),
            ["big.0", "big.1", "big.2", "big.3", "s1.0", "s1.1", "s1.2", "s2.0", "s2.1", "s2.2",
             "big.4", "big.5", "big.6", "big.7", "big.8", "big.9"])
    }

    func testAJobDroppedInItsTurnLeavesTheNextAWholeTurn() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 3)
        // 64 one-fetch jobs, emptied without a compaction; dropping the job in its turn makes the 65th empty place.
        for job in 0..<64 { queue.enqueue(ticket("e\(job)", 0), host: "h") }
        for n in 0..<10 { queue.enqueue(ticket("big", n), host: "h") }
        for job in 0..<10 { for n in 0..<4 { queue.enqueue(ticket("f\(job)", n), host: "h") } }
        XCTAssertEqual(serve(&queue, count: 66).suffix(2), ["big.0", "big.1"])
        queue.removeJob("big")
        XCTAssertEqual(serve(&queue, count: 4), ["f0.0", "f0.1", "f0.2", "f1.0"])
    }

    func testThousandsOfJobsComingAndGoingKeepTheirTurns() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 1)
        for job in 0..<1_000 { queue.enqueue(ticket("j\(job)", 0), host: "h") }
        XCTAssertEqual(serve(&queue, count: 700), (0..<700).map { "j\($0).0" })
        // Past the compaction of the emptied places: a job dropped is skipped; one emptied and queued again takes
        // its turn behind the jobs waiting in this round, before their second fetches.
        for job in 700..<1_000 where job % 3 == 0 { queue.enqueue(ticket("j\(job)", 1), host: "h") }
        queue.removeJob("j999")
        queue.enqueue(ticket("j5", 1), host: "h")
        let rest = serve(&queue)
        XCTAssertEqual(rest.count, 300 + 100 - 2 + 1, "j999's two dropped, j5's new one taken")
        XCTAssertFalse(rest.contains("j999.1"))
        XCTAssertEqual(rest.firstIndex(of: "j5.1"), rest.firstIndex(of: "j998.0").map { $0 + 1 })
        XCTAssertEqual(rest.firstIndex(of: "j702.1"), rest.firstIndex(of: "j5.1").map { $0 + 1 })
        XCTAssertEqual(rest.last, "j996.1")
        XCTAssertEqual(queue.waiting, 0)
    }

    func testAHostAtItsLimitDoesNotHoldUpAnother() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 2)
        for job in 0..<50 { queue.enqueue(ticket("j\(job)", 0), host: "busy") }
        queue.enqueue(ticket("x", 0), host: "free")
        queue.enqueue(ticket("x", 1), host: "free")
        let taken = drain(&queue)
        XCTAssertEqual(taken.filter { $0.hasSuffix("@busy") }.count, 2, "the per-host limit")
        XCTAssertEqual(taken.filter { $0.hasSuffix("@free") }, ["x.0@free", "x.1@free"])
        XCTAssertNil(queue.next())
        queue.finished(host: "busy")
        XCTAssertEqual(queue.next()?.1, "busy", "a slot given back is taken by the next waiting fetch")
        XCTAssertEqual(queue.waiting, 47)
    }

    func testAPlainHTTPHostIsHandedTwiceItsSlots() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 2, heldInFetcher: 2)
        queue.rateLimiter = HostRateLimiter([HostRate(host: "limited", perSecond: 1e9)])
        for n in 0..<6 {
            queue.enqueue(ticket("a", n), host: "http://h")
            queue.enqueue(ticket("b", n), host: "https://t")
            queue.enqueue(ticket("c", n), host: "http://limited")
        }
        let taken = drain(&queue)
        XCTAssertEqual(taken.filter { $0.hasSuffix("@http://h") }.count, 4, "two slots and two held by the fetcher")
        XCTAssertEqual(taken.filter { $0.hasSuffix("@https://t") }.count, 2, "over TLS, HTTP/2 runs all it is handed")
        XCTAssertEqual(taken.filter { $0.hasSuffix("@http://limited") }.count, 2, "a host with a rate: its slots only")
        XCTAssertEqual(queue.heldBeyondSlots, 2)
        queue.finished(host: "http://h")
        XCTAssertEqual(queue.heldBeyondSlots, 1, "a held fetch runs in the freed slot")
        XCTAssertEqual(queue.next()?.1, "http://h", "and the host may be handed one more")
    }

    func testTheTotalCountsOnlyTheFetchesThatRun() {
        var queue = FetchQueue(maxTotal: 3, maxPerHost: 2, heldInFetcher: 2)
        for n in 0..<10 { queue.enqueue(ticket("a", n), host: "http://h") }
        XCTAssertEqual(drain(&queue).count, 4)
        XCTAssertEqual(queue.heldBeyondSlots, 2)
        queue.enqueue(ticket("g", 0), host: "http://g")
        queue.enqueue(ticket("g", 1), host: "http://g")
        XCTAssertEqual(drain(&queue), ["g.0@http://g"], "three run: the total")
        queue.finished(host: "http://h")
        XCTAssertNil(queue.next(), "a held fetch runs in the freed slot, so the total is still full")
        queue.finished(host: "http://g")
        XCTAssertEqual(drain(&queue).sorted(), ["a.4@http://h", "g.1@http://g"])
        XCTAssertEqual(queue.inFlight - queue.heldBeyondSlots, 3)
    }

    func testWithoutHoldingAHostIsHandedItsSlotsOnly() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 2)
        for n in 0..<6 { queue.enqueue(ticket("a", n), host: "http://h") }
        XCTAssertEqual(drain(&queue).count, 2)
        XCTAssertEqual(queue.heldBeyondSlots, 0)
    }

    func testTheTotalLimitHolds() {
        var queue = FetchQueue(maxTotal: 3, maxPerHost: 10)
        for n in 0..<5 { queue.enqueue(ticket("a", n), host: "h\(n)") }
        XCTAssertEqual(drain(&queue).count, 3)
        queue.finished(host: "h0")
        XCTAssertEqual(drain(&queue).count, 1)
        XCTAssertEqual(queue.inFlight, 3)
    }

    func testADroppedJobLeavesNothingBehind() {
        var queue = FetchQueue(maxTotal: 100, maxPerHost: 100)
        for n in 0..<4 {
            queue.enqueue(ticket("a", n), host: "h")
            queue.enqueue(ticket("b", n), host: "h")
            queue.enqueue(ticket("a", 10 + n), host: "g")
        }
        _ = queue.next()
        queue.removeJob("a")
        XCTAssertEqual(queue.waiting, 4)
        XCTAssertEqual(Set(drain(&queue).map { $0.prefix(1) }), ["b"])
        queue.removeJob("b")
        XCTAssertEqual(queue.waiting, 0)
    }

    /// The host key of a URL, and when a URL is known to have a key already at hand (`url(_:hasHostKey:)`, which a
    /// run uses to skip working the key out again): only when it is the key followed by the end of the authority.
    func testAURLHasTheLastHostKeyOnlyWhenItBeginsWithItWholeAndLowercase() {
        let rows: [(url: String, key: String, hostKey: String, has: Bool)] = [
            ("http://a.local:80/x", "http://a.local:80", "http://a.local:80", true),
            ("http://a.local:80", "http://a.local:80", "http://a.local:80", true),
            ("http://a.local?q=1", "http://a.local", "http://a.local", true),
            ("http://a.local#f", "http://a.local", "http://a.local", true),
            ("http://a.local:8080/x", "http://a.local:80", "http://a.local:8080", false),
            ("http://a.local.evil/x", "http://a.local", "http://a.local.evil", false),
            ("HTTP://A.local/x", "http://a.local", "http://a.local", false),
            ("http://user@a.local/x", "http://a.local", "http://a.local", false),
            ("https://a.local/x", "http://a.local", "https://a.local", false),
            ("http://a.local/x", "", "http://a.local", false),
            ("http://a.lo", "http://a.local", "http://a.lo", false),
        ]
        for row in rows {
            XCTAssertEqual(FetchQueue.hostKey(of: row.url), row.hostKey, row.url)
            XCTAssertEqual(FetchQueue.url(row.url, hasHostKey: row.key), row.has, "\(row.url) with \(row.key)")
        }
    }
}
