import Foundation
import XCTest
@testable import JobCore

/// The outbox rows the triggers of schema version 3 write: with the job, and with its settled state.
class WebhookOutboxTriggerTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    /// The outbox row of job `id` (`PostgresWebhookOutboxTriggerTests` reads it from PostgreSQL).
    func row(_ id: String) throws -> (state: String, delivery: String?, url: String)? {
        let connection = try SQLiteConnection(path: dbPath, create: false)
        defer { connection.close() }
        let statement = try connection.prepare("SELECT state, delivery, url FROM webhook_outbox WHERE job_id = ?1")
        defer { statement.reset() }
        statement.bind(1, id)
        guard try statement.step() else { return nil }
        return (statement.string(0) ?? "", statement.string(1), statement.string(2) ?? "")
    }

    func testRowIsWrittenWithTheJobAndMadePendingWithItsSettledState() throws {
        let store = try makeStore()
        defer { store.close() }
        let (created, nodes) = makeJob(1)
        var job = created
        job.request = .object([
            JSONMember("graph", .object([JSONMember("type", .string("list"))])),
            JSONMember("notify", .object([JSONMember("url", .string("http://hooks.local/x"))])),
        ])
        _ = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        let plain = try create(store, 2)
        XCTAssertNil(try row(plain.id), "a job without notify has no row")
        let waiting = try XCTUnwrap(try row(job.id))
        XCTAssertEqual(waiting.state, "waiting")
        XCTAssertNil(waiting.delivery)
        XCTAssertEqual(waiting.url, "http://hooks.local/x")

        job.state = .running
        job.version = 2
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertEqual(try row(job.id)?.state, "waiting", "running is not settled")

        job.state = .succeeded
        job.version = 5
        job.finishedAt = 1_700_000_000_500
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        let pending = try XCTUnwrap(try row(job.id))
        XCTAssertEqual(pending.state, "pending")
        XCTAssertEqual(pending.delivery, "\(job.id).5")

        // A later write of the settled job (leftover nodes settled at start) makes no new delivery.
        job.version = 6
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertEqual(try row(job.id)?.delivery, "\(job.id).5")
    }

    /// SQLite's JSON functions refuse a document nested deeper than about 1,000 levels: such a request (allowed with
    /// a raised `--max-depth`) is still stored, and only a request naming `notify` is read by the trigger at all.
    func testRequestTooDeepForSQLiteJSONIsStillStored() throws {
        let store = try makeStore()
        defer { store.close() }
        let (created, nodes) = makeJob(4)
        var job = created
        var deep = JSONValue.null
        for _ in 0..<3000 { deep = .array([deep]) }
        job.request = .object([JSONMember("graph", .object([JSONMember("type", .string("list"))])), JSONMember("x", deep)])
        guard case .created = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil) else {
            return XCTFail("not created")
        }
        job.request = .object([JSONMember("notify", .object([JSONMember("url", .string("http://h/"))])), JSONMember("x", deep)])
        job.id = jobID(5)
        guard case .created = try store.createJob(job, nodes: nodes.map { var n = $0; n.jobID = job.id; return n },
                                                  idempotencyKey: nil, requestHash: nil) else {
            return XCTFail("not created")
        }
        if triggerParsesDeepJSON {
            XCTAssertNotNil(try row(job.id))
        } else {
            XCTAssertNil(try row(job.id), "too deep for the trigger (submissions refuse this with notify)")
        }
    }

    /// SQLite's JSON functions stop at about 1,000 levels; PostgreSQL's jsonb parses 3,000.
    var triggerParsesDeepJSON: Bool { false }

    func testSubmissionWithNotifyNestedTooDeepIsRefused() throws {
        var deep = "1"
        for _ in 0..<NotifyParser.maxRequestDepth { deep = "[\(deep)]" }
        let body = #"{"graph":{"type":"fetch","url":"http://a/"},"notify":{"url":"http://h/"},"metadata":{"x":\#(deep)}}"#
        var limits = Limits()
        limits.maxDepth = 1000
        XCTAssertThrowsError(try JobSpec.parse(try JSONValue.parse(body, maxDepth: 5000), limits: limits)) { error in
            XCTAssertEqual((error as? ValidationError)?.issues.first?.pointer, "/notify")
        }
        XCTAssertFalse(NotifyParser.depth(of: try JSONValue.parse("[[1]]"), exceeds: 2))
        XCTAssertTrue(NotifyParser.depth(of: try JSONValue.parse("[[[1]]]"), exceeds: 2))
    }

    func testDeleteKeepsOnlyAPendingDelivery() throws {
        let store = try makeStore()
        defer { store.close() }
        let (created, nodes) = makeJob(3)
        var job = created
        job.request = .object([JSONMember("notify", .object([JSONMember("url", .string("http://hooks.local/y"))]))])
        _ = try store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil)
        job.state = .failed
        job.version = 2
        store.enqueue(jobs: [job], nodes: [], bodies: [])
        try store.flush()
        XCTAssertTrue(try store.deleteJob(id: job.id))
        XCTAssertEqual(try row(job.id)?.state, "pending", "a pending delivery outlives the job's delete")
    }
}

/// The PL/pgSQL triggers of `PostgresSchema`, by the same tests.
final class PostgresWebhookOutboxTriggerTests: WebhookOutboxTriggerTests, @unchecked Sendable {  // as StoreTestCase
    override class var usesPostgres: Bool { true }

    override var triggerParsesDeepJSON: Bool { true }

    /// Declared here so that Linux test discovery lists the inherited tests of this class.
    func testTheStoreIsPostgres() throws {
        let store = try makeStore()
        defer { store.close() }
        XCTAssertTrue(store is PostgresJobStore)
    }

    override func row(_ id: String) throws -> (state: String, delivery: String?, url: String)? {
        let connection = try PostgresConnection(url: databaseURL)
        defer { connection.close() }
        let rows = try connection.query("SELECT state, delivery, url FROM webhook_outbox WHERE job_id = $1", [.text(id)])
        guard let row = rows.rows.first else { return nil }
        return (row[0] ?? "", row[1], row[2] ?? "")
    }
}
