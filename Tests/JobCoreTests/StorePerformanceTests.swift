import Foundation
import XCTest
@testable import JobCore

#if canImport(Glibc)
import Glibc
#endif

/// Timing checks. The bounds are loose enough for a debug build on a busy
/// two-core machine; the figures are printed. The comparison with the sqlite3
/// command-line tool runs only with `JOBSERVER_STORE_BENCH=1` (use a release build).
final class StorePerformanceTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    func testRecoveryLoadsTenThousandUnfinishedJobsWithTwoQueries() throws {
        let store = try openStore()
        defer { store.close() }
        let jobs = 10_000
        let start = Timestamp.monotonicMs()
        onThreads(8) { t in
            for i in stride(from: t, to: jobs, by: 8) {
                try self.create(store, i, state: i % 2 == 0 ? .running : .pending, nodes: 10)
            }
        }
        let created = Timestamp.monotonicMs()
        for i in 0..<100 { try create(store, jobs + i, state: .succeeded, nodes: 10) }

        let loadStart = Timestamp.monotonicMs()
        let unfinished = try store.unfinishedJobs()
        let loadMs = Timestamp.monotonicMs() - loadStart
        XCTAssertEqual(unfinished.count, jobs)
        XCTAssertEqual(unfinished.first?.job.id, jobID(0))
        XCTAssertEqual(unfinished.last?.job.id, jobID(jobs - 1))
        XCTAssertTrue(unfinished.allSatisfy { $0.nodes.count == 10 && $0.nodes.last?.position == 9 })
        print("store: created \(jobs) 10-node jobs from 8 threads in \(created - start) ms; "
              + "unfinishedJobs loaded them in \(loadMs) ms")
    }

    func testCompareDurableSubmissionsWithTheSQLiteCommandLine() throws {
        guard ProcessInfo.processInfo.environment["JOBSERVER_STORE_BENCH"] == "1" else {
            throw XCTSkip("set JOBSERVER_STORE_BENCH=1 to run")
        }
        let count = Int(ProcessInfo.processInfo.environment["JOBSERVER_STORE_BENCH_JOBS"] ?? "") ?? 3000

        // The ceiling: the sqlite3 tool inserting the same rows, one transaction per job, WAL, synchronous=FULL.
        let cliDB = folder + "/cli.sqlite"
        var script = "PRAGMA journal_mode = WAL;\nPRAGMA synchronous = FULL;\n" + StoreSchema.migrations[0] + "\n"
        for n in 0..<count {
            let (job, nodes) = makeJob(n, nodes: 10)
            script += "BEGIN;\n" + insertSQL(job) + nodes.map(insertSQL).joined() + "COMMIT;\n"
        }
        let scriptPath = folder + "/script.sql"
        try script.write(toFile: scriptPath, atomically: false, encoding: .utf8)
        let cliStart = Timestamp.monotonicMs()
        XCTAssertEqual(runSQLite(cliDB, script: scriptPath), 0)
        let cliMs = max(1, Timestamp.monotonicMs() - cliStart)

        let store = try openStore()
        defer { store.close() }
        let oneStart = Timestamp.monotonicMs()
        for n in 0..<count { try create(store, n, nodes: 10) }
        let oneMs = max(1, Timestamp.monotonicMs() - oneStart)

        let threads = 8
        let manyStart = Timestamp.monotonicMs()
        onThreads(threads) { t in
            for i in stride(from: t, to: count, by: threads) { try self.create(store, count + i, nodes: 10) }
        }
        let manyMs = max(1, Timestamp.monotonicMs() - manyStart)

        func rate(_ ms: Int64) -> Int { Int(Double(count) * 1000 / Double(ms)) }
        print("store bench (\(count) durable 10-node jobs): sqlite3 CLI \(rate(cliMs)) jobs/s; "
              + "createJob 1 thread \(rate(oneMs)) jobs/s (\(String(format: "%.2f", Double(cliMs) / Double(oneMs)))x); "
              + "\(threads) threads \(rate(manyMs)) jobs/s (\(String(format: "%.2f", Double(cliMs) / Double(manyMs)))x)")
    }

    private func literal(_ s: String?) -> String {
        guard let s else { return "NULL" }
        return "'" + s.replacingOccurrences(of: "'", with: "''") + "'"
    }

    private func insertSQL(_ job: JobRecord) -> String {
        let p = job.progress
        let values: [String] = [
            literal(job.id), literal(job.name), literal(job.state.rawValue), String(job.createdAt), "NULL", "NULL",
            "NULL", String(job.version), String(p.total), String(p.pending), String(p.running), String(p.succeeded),
            String(p.failed), String(p.cancelled), String(p.skipped), "NULL", "NULL", "NULL", literal(job.request.text),
            "NULL", "NULL",
        ]
        return "INSERT INTO jobs (\(Columns.jobRow), idempotency_key, request_hash) VALUES (\(values.joined(separator: ", ")));\n"
    }

    private func insertSQL(_ node: NodeRecord) -> String {
        let values: [String] = [
            literal(node.jobID), String(node.position), literal(node.id), literal(node.parent), literal(node.type),
            literal(node.state.rawValue), String(node.attempts), "NULL", "NULL", "NULL", "NULL", "0", "NULL", "NULL",
        ]
        return "INSERT INTO nodes (\(Columns.node)) VALUES (\(values.joined(separator: ", ")));\n"
    }

    private func runSQLite(_ database: String, script: String) -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, script, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        var argv: [UnsafeMutablePointer<CChar>?] = [String](["sqlite3", database]).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid = pid_t()
        guard posix_spawnp(&pid, "sqlite3", &actions, nil, &argv, environ) == 0 else { return -1 }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        return status
    }
}
