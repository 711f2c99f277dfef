import Foundation
import TestSupport
import Threads
import XCTest
@testable import JobCore

#if canImport(Glibc)
import Glibc
#endif

/// Kills a process that is writing to the store and checks what survived.
///
/// The child is this same test binary, started with an environment variable
/// that makes `testChildWritesUntilKilled` do the writing; run normally, that
/// test does nothing.
class StoreDurabilityTests: StoreTestCase, @unchecked Sendable {  // @unchecked: as StoreTestCase's
    private static let childDatabase = "JOBSERVER_STORE_CHILD_DB"
    private static let childAcks = "JOBSERVER_STORE_CHILD_ACKS"

    func testChildWritesUntilKilled() throws {
        let env = ProcessInfo.processInfo.environment
        guard let path = env[Self.childDatabase], let ackPath = env[Self.childAcks] else { return }
        let acks = open(ackPath, O_WRONLY | O_APPEND | O_CREAT, 0o644)
        guard acks >= 0 else { exit(3) }
        // The parent's store: a SQLite file, or a PostgreSQL database (`PostgresStoreDurabilityTests`).
        let store: JobStore = path.hasPrefix("postgres://") ? try PostgresJobStore(url: path) : try SQLiteJobStore(path: path)
        @Sendable func ack(_ line: String) {
            let bytes = Array((line + "\n").utf8)
            _ = bytes.withUnsafeBytes { write(acks, $0.baseAddress, $0.count) }
        }
        // Killed once 200 submissions were answered, or 10 s in: a fixed 300 ms saw as few as 4 answered on a
        // loaded machine under AddressSanitizer, too few to test anything. The other submitters are mid-write then.
        let answered = Locked(0)
        let killer = DispatchWorkItem { kill(getpid(), SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(10), execute: killer)
        // Several submitters, so that kills land inside group commits too.
        DispatchQueue.concurrentPerform(iterations: 4) { t in
            for i in 0..<100_000 {
                let n = t * 1_000_000 + i
                let (job, nodes) = makeJob(n, nodes: 10)
                guard (try? store.createJob(job, nodes: nodes, idempotencyKey: nil, requestHash: nil)) != nil else { exit(4) }
                ack("created \(job.id)")
                if answered.withLock({ count in
                    count += 1
                    return count
                }) == 200 {
                    kill(getpid(), SIGKILL)
                }
                if i % 10 == 9 {
                    var changed = job
                    changed.version = 2
                    changed.state = .running
                    store.enqueue(jobs: [changed], nodes: [], bodies: [])
                    guard (try? store.flush()) != nil else { exit(5) }
                    ack("flushed \(job.id)")
                }
            }
        }
        exit(6)  // Never reached: the killer fires first.
    }

    /// Where the child writes: this test's SQLite file.
    func childStoreLocation() throws -> String { dbPath }

    func testJobsAnsweredBeforeAKillSurviveIt() throws {
        if ProcessInfo.processInfo.environment[Self.childDatabase] != nil { return }  // never recurse in the child
        let ackPath = folder + "/acks"
        let binary = CommandLine.arguments[0]
        let args = [binary, "JobCoreTests.StoreDurabilityTests/testChildWritesUntilKilled"]
        var environment = ProcessInfo.processInfo.environment
        environment[Self.childDatabase] = try childStoreLocation()
        environment[Self.childAcks] = ackPath
        let envStrings = environment.map { "\($0.key)=\($0.value)" }
        var argv: [UnsafeMutablePointer<CChar>?] = args.map { strdup($0) } + [nil]
        var envp: [UnsafeMutablePointer<CChar>?] = envStrings.map { strdup($0) } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var pid = pid_t()
        XCTAssertEqual(posix_spawn(&pid, binary, &actions, nil, &argv, &envp), 0)
        // The child's end is awaited by a blocking waitpid; one still alive after 30 s is killed by a timer, whose
        // queue also orders the flag it sets before the read below.
        let timer = DispatchQueue(label: "durability-child-timer")
        let overdue = Box(false)
        let killer = DispatchWorkItem {
            overdue.value = true
            kill(pid, SIGKILL)
        }
        timer.asyncAfter(deadline: .now() + 30, execute: killer)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1, errno == EINTR {}
        let timedOut = timer.sync {
            killer.cancel()
            return overdue.value
        }
        XCTAssertFalse(timedOut, "child did not die in time")
        guard !timedOut else { return }
        XCTAssertEqual(status & 0x7F, SIGKILL, "child ended with status \(status)")

        let text = (try? String(contentsOfFile: ackPath, encoding: .utf8)) ?? ""
        let lines = text.split(separator: "\n")
        let created = lines.filter { $0.hasPrefix("created ") }.map { String($0.dropFirst(8)) }
        let flushed = lines.filter { $0.hasPrefix("flushed ") }.map { String($0.dropFirst(8)) }
        XCTAssertGreaterThan(created.count, 20, "the child answered too few submissions to test anything")

        let store = try makeStore()
        defer { store.close() }
        for id in created {
            guard try store.job(id: id) != nil else { return XCTFail("answered job \(id) was lost") }
            XCTAssertEqual(try store.nodes(jobID: id, includeResults: false).count, 10, id)
        }
        for id in flushed {
            XCTAssertEqual(try store.job(id: id)?.version, 2, "flushed change of \(id) was lost")
        }
        print("store durability: \(created.count) answered jobs and \(flushed.count) flushed changes survived kill -9")
    }
}
