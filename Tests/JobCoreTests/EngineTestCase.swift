import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// Engines on real SQLite files in a temp folder, fetching from one local upstream per test class; every engine
/// made is shut down after its test.
class EngineTestCase: XCTestCase {
    // nonisolated(unsafe), both statics: written only by the class `setUp` and `tearDown`, and read by that class's
    // tests between them; XCTest runs these one after another, and a test's threads start after the write.
    nonisolated(unsafe) static var upstream: Upstream?
    var upstream: Upstream { Self.upstream! }
    var directory = ""
    var engines: [Engine] = []

    /// True in the subclasses that run their inherited tests on PostgreSQL (PostgresEngineTests.swift).
    class var usesPostgres: Bool { false }
    /// The class's throwaway cluster while a PostgreSQL class runs (XCTest runs one class at a time).
    nonisolated(unsafe) static var postgres: PostgresTestCluster?
    /// The database of each `dbName` of the current test, on PostgreSQL.
    var databases: [String: String] = [:]

    override class func setUp() {
        upstream = try? Upstream.start()
        postgres = PostgresTestCluster.started(if: usesPostgres)
    }

    override class func tearDown() {
        upstream?.stop()
        upstream = nil
        postgres?.stop()
        postgres = nil
    }

    override func setUpWithError() throws {
        guard Self.upstream != nil else { throw XCTSkip("the upstream fixture did not start") }
        directory = NSTemporaryDirectory() + "engine-tests-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try upstream.resetStats()
        databases = [:]
    }

    /// The store named `dbName` of this test: a SQLite file in the test's folder, or on PostgreSQL a database of
    /// the class's cluster, made on first use; every store opened with one name within a test sees the same data.
    func makeStore(dbName: String = "jobs.sqlite") throws -> JobStore {
        guard Self.usesPostgres else { return try SQLiteJobStore(path: directory + "/" + dbName) }
        if let url = databases[dbName] { return try PostgresJobStore(url: url) }
        guard let postgres = Self.postgres else { throw StoreError(.open, "the PostgreSQL cluster was not started") }
        let url = try postgres.freshDatabase()
        databases[dbName] = url
        return try PostgresJobStore(url: url)
    }

    override func tearDown() {
        for engine in engines { engine.shutdown(gracePeriodMs: 2000) }
        engines.removeAll()
        try? FileManager.default.removeItem(atPath: directory)
        directory = ""
        databases = [:]
    }

    /// Runs `sql` on its own connection to the store named `dbName` (damage that only a crash or a bug could do).
    func executeRaw(_ sql: String, dbName: String = "jobs.sqlite") throws {
        if Self.usesPostgres {
            guard let url = databases[dbName] else { throw StoreError(.open, "no database \(dbName) yet") }
            let db = try PostgresConnection(url: url)
            defer { db.close() }
            try db.execute(sql)
        } else {
            let db = try SQLiteConnection(path: directory + "/" + dbName, create: false)
            defer { db.close() }
            try db.execute(sql)
        }
    }

    /// Keeps the store named `dbName` from committing writes (reads go on) until the returned function is called:
    /// another connection holds SQLite's write lock, or PostgreSQL table locks that writes wait for.
    func holdWriteLock(dbName: String = "jobs.sqlite") throws -> () throws -> Void {
        if Self.usesPostgres {
            guard let url = databases[dbName] else { throw StoreError(.open, "no database \(dbName) yet") }
            let db = try PostgresConnection(url: url)
            try db.execute("BEGIN; LOCK TABLE jobs, nodes IN EXCLUSIVE MODE")
            return {
                defer { db.close() }
                try db.execute("COMMIT")
            }
        }
        let db = try SQLiteConnection(path: directory + "/" + dbName, create: false)
        try db.execute("BEGIN IMMEDIATE")
        return {
            defer { db.close() }
            try db.execute("COMMIT")
        }
    }

    /// Waits (at most `seconds`) until the job is settled and every node of it too; the record as the engine had
    /// it then.
    func settled(_ engine: Engine, _ id: String, seconds: Double = 15) throws -> JobRecord {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let job: JobRecord? = try engine.answer("job \(id)") { done in
                _ = engine.waitForChange(id: id, afterVersion: nil, timeoutMs: 200) { done($0) }
            }
            if let job, job.state.isSettled, job.progress.pending + job.progress.running == 0 { return job }
        }
        throw UpstreamError("job \(id) did not settle within \(seconds) s")
    }

    /// The states of the job's nodes as the store holds them, once every change the engine has shown is committed:
    /// `metrics`, read on the engine's queue, comes after the turn that handed those changes to the store, and
    /// `flush` then waits for their commit.
    func storedStates(_ engine: Engine, _ id: String) throws -> [NodeState] {
        _ = try engine.metricsNow
        try engine.store.flush()
        return try engine.store.nodes(jobID: id, includeResults: false).map(\.state)
    }

    /// Waits (at most `seconds`) until `condition` holds, looking again each time job `id` changes: the engine's
    /// long-poll on its version, which every change of a node's state moves (API.md §1), never a set interval.
    /// `condition` is about the job as the engine shows it, not as stored (the store follows later).
    /// - Returns: whether it held in time (for a job that does not exist: whether it holds now).
    func untilJob(_ engine: Engine, _ id: String, seconds: Double = 10, _ condition: () throws -> Bool) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while true {
            // The version is read before the condition: a change between the two ends the wait at once.
            guard let version = try engine.job(id: id)?.version else { return try condition() }
            if try condition() { return true }
            let left = Int(deadline.timeIntervalSinceNow * 1000)
            if left <= 0 { return false }
            // Within `answer`'s own 10 s.
            _ = try engine.answer("a change of job \(id)") { done in
                _ = engine.waitForChange(id: id, afterVersion: version, timeoutMs: min(left, 5000)) { done($0 != nil) }
            }
        }
    }

    /// Submits the job `body` (the JSON of `POST /v1/jobs`), with an idempotency `key` if given; the job created,
    /// or the one `key` already named.
    func submit(_ engine: Engine, _ body: String, key: String? = nil) throws -> JobRecord {
        let json = try JSONValue.parse(body)
        let spec = try JobSpec.parse(json)
        switch try engine.submit(spec, request: json, idempotencyKey: key) {
        case .created(let job), .existing(let job): return job
        case let other: throw UpstreamError("submit answered \(other)")
        }
    }

    /// An engine on a fresh store (`store` may wrap it), started; stopped at the end of the test.
    func makeEngine(
        dbName: String = "jobs.sqlite", configure: (inout EngineConfiguration) -> Void = { _ in },
        fetcher configureFetcher: (inout FetcherConfiguration) -> Void = { _ in },
        store wrap: (JobStore) -> JobStore = { $0 },
        renderSettled: (@Sendable (JobRecord) -> [UInt8])? = nil,
        renderSettledAround: (@Sendable (JobRecord, StoredResultText) throws -> SettledAnswer)? = nil,
        renderNodeList: (@Sendable ([NodeRecord]) -> [UInt8])? = nil
    ) throws -> Engine {
        let store = wrap(try makeStore(dbName: dbName))
        var fetcherConfig = FetcherConfiguration()
        fetcherConfig.denyCIDRs = []
        configureFetcher(&fetcherConfig)
        let fetcher = try Fetcher(configuration: fetcherConfig)
        var config = EngineConfiguration()
        configure(&config)
        let engine = Engine(
            store: store, fetcher: fetcher, configuration: config, logger: .disabled,
            rendering: AnswerRendering(settled: renderSettled, settledAround: renderSettledAround, nodeList: renderNodeList))
        try engine.start()
        engines.append(engine)
        return engine
    }
}

/// Blocking reads over the engine's asynchronous entry points, for tests (never on an event loop), over
/// `Engine.answer` (TestSupport).
extension Engine {
    /// The job as it is now (a long-poll that does not wait).
    func job(id: String) throws -> JobRecord? {
        try answer("job \(id)") { done in _ = waitForChange(id: id, afterVersion: nil, timeoutMs: 0) { done($0) } }
    }

    func nodes(jobID: String, includeResults: Bool) throws -> [NodeRecord]? {
        try answer("nodes of \(jobID)") { done in nodes(jobID: jobID, includeResults: includeResults) { done($0) } }.get()
    }

    func node(jobID: String, nodeID: String) throws -> NodeRecord? {
        let lookup = try answer("node \(nodeID) of \(jobID)") { done in node(jobID: jobID, nodeID: nodeID) { done($0) } }.get()
        if case .found(let node) = lookup { return node }
        return nil
    }

    var metricsNow: EngineMetrics {
        get throws { try answer("metrics") { done in metrics { done($0) } } }
    }
}
