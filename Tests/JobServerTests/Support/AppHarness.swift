import Foundation
import HTTPServer
import JobCore
import TestSupport
import XCTest

@testable import JobServer

/// Log lines collected from a `Logger` sink.
final class LogLines: @unchecked Sendable {
    // @unchecked: `lines` is read and written only with `lock` held.
    private let lock = NSLock()
    private var lines: [JSONValue] = []

    func append(_ bytes: [UInt8]) {
        guard let value = try? JSONValue.parse(bytes.dropLast()) else { return }
        lock.lock()
        lines.append(value)
        lock.unlock()
    }

    var all: [JSONValue] {
        lock.lock()
        defer { lock.unlock() }
        return lines
    }
}

/// A response as a test sees it.
struct Answer {
    var status: Int
    var headers: HTTPHeaders
    var body: [UInt8]
    var json: JSONValue? { try? JSONValue.parse(body) }
    var errorCode: String? { json?["error"]?["code"]?.stringValue }
    var text: String { String(decoding: body, as: UTF8.self) }
}

/// Where `AppHarness` puts its store while a PostgreSQL test class runs (`PostgresAppRouteTests`): a database of
/// that class's throwaway cluster per SQLite path the harness was given, so that a harness made again on the same
/// path (a restart) finds the same data.
final class HarnessPostgres: @unchecked Sendable {
    // @unchecked: set by a class `setUp` and used by that class's tests, which XCTest runs one at a time.
    nonisolated(unsafe) static var current: HarnessPostgres?
    let cluster: PostgresCluster
    private var databases: [String: String] = [:]

    init(cluster: PostgresCluster) { self.cluster = cluster }

    func database(for path: String) throws -> String {
        if let url = databases[path] { return url }
        let url = try cluster.freshDatabase()
        databases[path] = url
        return url
    }
}

/// An `App` over a real engine (SQLite store in a temp folder, or PostgreSQL while `HarnessPostgres.current` is
/// set; real fetcher), called route by route without sockets.
final class AppHarness {
    let dir: URL
    let engine: Engine
    let fetcher: Fetcher
    let app: App
    let config: ServerConfig
    let logs = LogLines()

    init(_ configure: (inout ServerConfig) -> Void = { _ in }) throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("jobserver-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        var config = ServerConfig()
        config.host = "127.0.0.1"
        config.port = 0
        config.dbPath = dir.appendingPathComponent("jobs.sqlite").path
        config.denyCIDRs = []
        configure(&config)
        if let postgres = HarnessPostgres.current { config.dbPath = try postgres.database(for: config.dbPath) }
        self.config = config
        let logs = logs
        let logger = Logger(label: "test", minimumLevel: .info) { logs.append($0) }
        let store: JobStore
        if HarnessPostgres.current != nil {
            store = try PostgresJobStore(url: config.dbPath, logger: logger)
        } else {
            store = try SQLiteJobStore(path: config.dbPath, logger: logger)
        }
        fetcher = try Fetcher(configuration: config.fetcherConfiguration)
        engine = Service.engine(store: store, fetcher: fetcher, config: config, logger: logger)
        try engine.start()
        app = App(engine: engine, fetcher: fetcher, config: config, logger: logger)
    }

    func shutdown() {
        app.beginShutdown()
        engine.beginShutdown()
        engine.shutdown(gracePeriodMs: 2000)
        fetcher.shutdown()
        try? FileManager.default.removeItem(at: dir)
    }

    /// Starts a request; `onClose` receives the action the route registered for a client that goes away.
    func start(
        _ route: Route, id: String? = nil, node: String? = nil, query: [(String, String)] = [],
        headers: [(String, String)] = [], body: String? = nil, json: Bool = true,
        onClose: @escaping (@escaping @Sendable () -> Void) -> Void = { _ in },
        done: @escaping @Sendable (Answer) -> Void
    ) {
        var allHeaders = HTTPHeaders(headers)
        if json, body != nil, !allHeaders.contains("Content-Type") { allHeaders.add("Content-Type", "application/json") }
        if let token = config.token, !allHeaders.contains("Authorization") {
            allHeaders.add("Authorization", "Bearer \(token)")
        }
        var params: [String: String] = [:]
        if let id { params["id"] = id }
        if let node { params["node"] = node }
        var path = route.pattern
        for (name, value) in params { path = path.replacingOccurrences(of: "{\(name)}", with: value) }
        let request = APIRequest(
            method: route.method, path: path, headers: allHeaders, body: Array((body ?? "").utf8),
            queryItems: query.map { (name: $0.0, value: $0.1) }, pathParameters: params)
        let exchange = Exchange(
            request: request, logger: Logger(label: "test", minimumLevel: .info) { [logs] in logs.append($0) },
            deliver: { done(Answer(status: $0.status, headers: $0.headers, body: Self.body(of: $0))) },
            registerOnClose: onClose)
        app.handle(route, request, exchange)
    }

    /// The body of `response`, read from its file if it has one (held open by its owner, which `response` holds).
    static func body(of response: HTTPResponse) -> [UInt8] {
        guard let file = response.bodyFile else { return response.body }
        var bytes = [UInt8](repeating: 0, count: file.count)
        let read = bytes.withUnsafeMutableBytes { pread(file.fd, $0.baseAddress, $0.count, 0) }
        return read == file.count ? bytes : []
    }

    /// Calls a route and waits (bounded) for its answer.
    func call(
        _ route: Route, id: String? = nil, node: String? = nil, query: [(String, String)] = [],
        headers: [(String, String)] = [], body: String? = nil, json: Bool = true, timeout: Double = 10,
        file: StaticString = #filePath, line: UInt = #line
    ) -> Answer {
        let box = AnswerBox()
        start(route, id: id, node: node, query: query, headers: headers, body: body, json: json) { box.put($0) }
        guard let answer = box.wait(timeout) else {
            XCTFail("no answer within \(timeout) s", file: file, line: line)
            return Answer(status: 0, headers: HTTPHeaders(), body: [])
        }
        return answer
    }

    /// Submits a job and returns its id.
    func submit(_ body: String, file: StaticString = #filePath, line: UInt = #line) -> String {
        let answer = call(.submitJob, body: body, file: file, line: line)
        XCTAssertEqual(answer.status, 201, answer.text, file: file, line: line)
        return answer.json?["id"]?.stringValue ?? ""
    }

    /// Long-polls until the job is settled (bounded) and returns it.
    func settled(_ id: String, file: StaticString = #filePath, line: UInt = #line) -> JSONValue? {
        for _ in 0..<5 {
            let answer = call(.getJob, id: id, query: [("wait", "5")], timeout: 10, file: file, line: line)
            guard let job = answer.json, let state = job["state"]?.stringValue else { return nil }
            if NodeState(rawValue: state)?.isSettled == true { return job }
        }
        XCTFail("job \(id) did not settle", file: file, line: line)
        return nil
    }
}

/// Holds one answer handed over from another thread.
final class AnswerBox: @unchecked Sendable {
    // @unchecked: `answers` is read and written only with `lock` held; the other properties are constants.
    private let lock = NSLock()
    private let semaphore = DispatchSemaphore(value: 0)
    private var answers: [Answer] = []

    func put(_ answer: Answer) {
        lock.lock()
        answers.append(answer)
        lock.unlock()
        semaphore.signal()
    }

    func wait(_ seconds: Double) -> Answer? {
        guard semaphore.wait(timeout: .now() + seconds) == .success else { return nil }
        lock.lock()
        defer { lock.unlock() }
        return answers.first
    }

    /// The first answer, without waiting.
    var first: Answer? {
        lock.lock()
        defer { lock.unlock() }
        return answers.first
    }

    var count: Int {
        lock.lock()
        defer { lock.unlock() }
        return answers.count
    }
}

/// A job of one fetch.
func fetchJob(_ url: String, name: String? = nil) -> String {
    let namePart = name.map { #""name":"\#($0)","# } ?? ""
    return #"{\#(namePart)"graph":{"type":"fetch","url":"\#(url)"}}"#
}
