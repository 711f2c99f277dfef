import Foundation
import TestSupport
import Threads
import XCTest

@testable import JobCore

/// Records what a store tells its engine about leases.
private final class LeaseEvents: SharedStoreDelegate {
    let lost = Watched<[String]>([])
    let claimed = Watched<[String]>([])
    let cancels = Watched<[String]>([])
    let changed = Watched<[String]>([])
    let renewals = Watched(0)

    func leasesLost(_ ids: [String]) { lost.withLock { $0 += ids } }
    func jobsClaimed(
        _ jobs: [(job: JobRecord, nodes: [NodeRecord])], unreadable: [UnreadableJob], cancelRequested: Set<String>
    ) { claimed.withLock { $0 += jobs.map(\.job.id) } }
    func cancelRequested(_ ids: [String]) { cancels.withLock { $0 += ids } }
    func jobsChanged(_ ids: [String]) { changed.withLock { $0 += ids } }
    func leasesRenewed() { renewals.withLock { $0 += 1 } }
}

/// Several stores on one database, as several servers (API.md §10): ownership, takeover, fencing, durable cancel.
final class PostgresLeaseTests: PostgresDatabaseTestCase {
    private func job(_ id: String, state: NodeState = .pending) -> (JobRecord, [NodeRecord]) {
        var progress = Progress()
        progress.total = 1
        progress.pending = 1
        let job = JobRecord(
            id: id, name: "job \(id)", state: state, createdAt: 1_700_000_000_000,
            request: .object(["graph": .object(["type": "fetch"])]), progress: progress)
        return (job, [NodeRecord(jobID: id, id: "root", parent: nil, position: 0, type: "fetch")])
    }

    func testTheAcceptingStoreOwnsTheJobAndOthersDoNotResumeIt() throws {
        let first = try PostgresJobStore(url: databaseURL, leaseTtlMs: 60_000)
        defer { first.close() }
        let (record, nodes) = job("J1")
        _ = try first.createJob(record, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        let second = try PostgresJobStore(url: databaseURL, leaseTtlMs: 60_000)
        defer { second.close() }
        XCTAssertEqual(try second.unfinishedJobs().map(\.job.id), [], "a job another live store holds is not resumed")
        let rows = try raw("SELECT lease_owner, lease_generation FROM jobs WHERE id = 'J1'")
        XCTAssertEqual(rows.first?[0], first.leases.owner)
        XCTAssertEqual(rows.first?[1], "1")
    }

    func testAnExpiredLeaseIsClaimedAndTheOldOwnersWritesAreFencedOff() throws {
        // The first store never renews (its lease thread is not started).
        let first = try PostgresJobStore(url: databaseURL, leaseTtlMs: 60_000)
        defer { first.close() }
        let events = LeaseEvents()
        first.attach(events)
        let (record, nodes) = job("J1")
        _ = try first.createJob(record, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        let second = try PostgresJobStore(url: databaseURL, leaseTtlMs: 60_000)
        defer { second.close() }
        XCTAssertEqual(try second.unfinishedJobs().map(\.job.id), [], "the lease still runs")
        // Only the database's clock ends a lease: its expiry is moved to just before now, as if the time had passed.
        _ = try raw("UPDATE jobs SET lease_expires_at = \(PostgresLeases.nowMs) - 1 WHERE id = 'J1'")
        XCTAssertEqual(try second.unfinishedJobs().map(\.job.id), ["J1"])
        XCTAssertEqual(try raw("SELECT lease_generation FROM jobs WHERE id = 'J1'").first?[0], "2")

        var stale = record
        stale.state = .running
        stale.version = 2
        var staleNode = nodes[0]
        staleNode.state = .running
        first.enqueue(jobs: [stale], nodes: [staleNode], bodies: [])
        try first.flush()
        XCTAssertEqual(try second.jobState(id: "J1"), .pending, "the old owner's write was not applied")
        XCTAssertEqual(try second.node(jobID: "J1", nodeID: "root")?.state, .pending)
        XCTAssertEqual(events.lost.withLock { $0 }, ["J1"], "the old owner is told it lost the job")

        var current = record
        current.state = .running
        current.version = 2
        second.enqueue(jobs: [current], nodes: [], bodies: [])
        try second.flush()
        XCTAssertEqual(try first.jobState(id: "J1"), .running, "the new owner writes")
    }

    func testTheLeaseThreadRenewsClaimsAndHearsCancelsAndChanges() throws {
        let ttlMs: Int64 = 1_500
        let first = try PostgresJobStore(url: databaseURL, leaseTtlMs: ttlMs)
        defer { first.close() }
        let firstEvents = LeaseEvents()
        first.attach(firstEvents)
        first.beginLeasing()
        let (record, nodes) = job("J1")
        _ = try first.createJob(record, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        let expiry = { try self.raw("SELECT lease_expires_at FROM jobs WHERE id = 'J1'").first?.first.flatMap { $0.flatMap { Int64($0) } } }
        let firstExpiry = try XCTUnwrap(expiry())

        let second = try PostgresJobStore(url: databaseURL, leaseTtlMs: ttlMs)
        defer { second.close() }
        let secondEvents = LeaseEvents()
        second.attach(secondEvents)
        second.beginLeasing()
        // Renewed every ttl/3: once the lease has been pushed on by more than a whole ttl, the other store's
        // heartbeat (also every ttl/3) has looked for expired leases at least twice, and it must not have taken this.
        var renewedPast = false
        for _ in 0..<20 {  // about 4 renewals are needed
            let seen = firstEvents.renewals.withLock { $0 }
            if try (expiry() ?? 0) > firstExpiry + ttlMs {
                renewedPast = true
                break
            }
            guard firstEvents.renewals.wait(milliseconds: 2 * ttlMs, until: { $0 > seen }) else { break }
        }
        XCTAssertTrue(renewedPast, "the owner renews its lease")
        XCTAssertEqual(secondEvents.claimed.withLock { $0 }, [])
        XCTAssertTrue(first.leasesHold)

        XCTAssertTrue(try second.requestCancel(id: "J1"))
        XCTAssertTrue(firstEvents.cancels.wait(milliseconds: 10_000) { $0.contains("J1") }, "the owner hears the cancel")
        XCTAssertEqual(try raw("SELECT cancel_requested_at IS NOT NULL FROM jobs WHERE id = 'J1'").first?[0], "t")

        var running = record
        running.state = .running
        running.version = 2
        first.enqueue(jobs: [running], nodes: [], bodies: [])
        try first.flush()
        XCTAssertTrue(secondEvents.changed.wait(milliseconds: 10_000) { $0.contains("J1") }, "other servers hear the change")

        // A clean close gives the lease up: the other store claims the job at its next heartbeat.
        first.close()
        XCTAssertTrue(secondEvents.claimed.wait(milliseconds: 10_000) { $0 == ["J1"] })
        XCTAssertFalse(try second.requestCancel(id: "J404"))
    }

    func testADueJobIsTakenByOneStoreOnly() throws {
        let first = try PostgresJobStore(url: databaseURL)
        defer { first.close() }
        let second = try PostgresJobStore(url: databaseURL)
        defer { second.close() }
        var (record, nodes) = job("J1")
        record.dueAt = 1_000
        _ = try first.createJob(record, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        XCTAssertEqual(try raw("SELECT lease_owner IS NULL FROM jobs WHERE id = 'J1'").first?[0], "t", "nobody's while it waits")
        var unreadable: [UnreadableJob] = []
        XCTAssertEqual(try second.dueJobs(atOrBeforeMs: 2_000, after: nil, limit: 10, unreadable: &unreadable).map(\.job.id), ["J1"])
        XCTAssertEqual(try first.dueJobs(atOrBeforeMs: 2_000, after: nil, limit: 10, unreadable: &unreadable).map(\.job.id), [])
        XCTAssertEqual(
            try second.dueJobs(atOrBeforeMs: 2_000, after: nil, limit: 10, unreadable: &unreadable).map(\.job.id), ["J1"],
            "the holder finds it again")
    }

    func testHostSlotsAreSharedByStores() throws {
        let first = try PostgresJobStore(url: databaseURL)
        defer { first.close() }
        let second = try PostgresJobStore(url: databaseURL)
        defer { second.close() }
        let taken = Watched<[String]>([])
        first.acquireHostSlot("http://h", limit: 2) { if $0 { taken.withLock { $0.append("first 1") } } }
        first.acquireHostSlot("http://h", limit: 2) { if $0 { taken.withLock { $0.append("first 2") } } }
        XCTAssertTrue(taken.wait(milliseconds: 10_000) { $0.count == 2 })
        second.acquireHostSlot("http://h", limit: 2) { if $0 { taken.withLock { $0.append("second") } } }
        second.acquireHostSlot("http://other", limit: 2) { if $0 { taken.withLock { $0.append("other host") } } }
        // The store serves its waiting fetches in arrival order: by the time the other host's slot is given,
        // the first host has been tried and found full.
        XCTAssertTrue(taken.wait(milliseconds: 10_000) { $0.contains("other host") })
        XCTAssertFalse(taken.withLock { $0.contains("second") }, "both slots of the host are held by the other store")
        first.releaseHostSlot("http://h")
        XCTAssertTrue(taken.wait(milliseconds: 10_000) { $0.contains("second") }, "a slot given back is taken by the waiting store")
    }

    func testIdempotencyKeysAreUniqueOverStores() throws {
        let first = try PostgresJobStore(url: databaseURL)
        defer { first.close() }
        let second = try PostgresJobStore(url: databaseURL)
        defer { second.close() }
        let (a, aNodes) = job("J1")
        let (b, bNodes) = job("J2")
        XCTAssertEqual(try first.createJob(a, nodes: aNodes, idempotencyKey: "k", requestHash: "h"), .created(a))
        guard case .existing(let existing) = try second.createJob(b, nodes: bNodes, idempotencyKey: "k", requestHash: "h") else {
            return XCTFail("the key was not found taken on the other store")
        }
        XCTAssertEqual(existing.id, "J1")
        guard case .conflict = try second.createJob(b, nodes: bNodes, idempotencyKey: "k", requestHash: "other") else {
            return XCTFail("another request under the key is not a conflict")
        }
    }
}
