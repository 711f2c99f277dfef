import Foundation
import TestSupport
import XCTest

@testable import JobCore

/// Engines on real SQLite files in a temp folder, fetching from one local upstream per test class; every engine
/// made is shut down after its test.
class EngineTestCase: XCTestCase {
    static var upstream: Upstream?
    var upstream: Upstream { Self.upstream! }
    var directory = ""
    var engines: [Engine] = []

    override class func setUp() {
        upstream = try? Upstream.start()
    }

    override class func tearDown() {
        upstream?.stop()
        upstream = nil
    }

    override func setUpWithError() throws {
        guard Self.upstream != nil else { throw XCTSkip("the upstream fixture did not start") }
        directory = NSTemporaryDirectory() + "engine-tests-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try upstream.resetStats()
    }

    override func tearDown() {
        for engine in engines { engine.shutdown(gracePeriodMs: 2000) }
        engines.removeAll()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func makeEngine(
        dbName: String = "jobs.sqlite", configure: (inout EngineConfiguration) -> Void = { _ in }
    ) throws -> Engine {
        let store = try SQLiteJobStore(path: directory + "/" + dbName)
        var fetcherConfig = FetcherConfiguration()
        fetcherConfig.denyCIDRs = []
        let fetcher = try Fetcher(configuration: fetcherConfig)
        var config = EngineConfiguration()
        configure(&config)
        let engine = Engine(store: store, fetcher: fetcher, configuration: config, logger: .disabled)
        try engine.start()
        engines.append(engine)
        return engine
    }
}

final class Box<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// Blocking reads over the engine's asynchronous entry points, for tests (never on an event loop).
extension Engine {
    /// Starts `start` and waits (at most 10 s) for the value it passes on.
    func answer<T>(_ what: String, _ start: (@escaping @Sendable (T) -> Void) -> Void) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let box = Box<T?>(nil)
        start { value in
            box.value = value
            done.signal()
        }
        guard done.wait(timeout: .now() + 10) == .success, let value = box.value else {
            throw UpstreamError("no answer for \(what) within 10 s")
        }
        return value
    }

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
