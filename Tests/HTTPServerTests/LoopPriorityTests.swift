import Foundation
import XCTest
@testable import HTTPServer
import Threads

/// The event loops ask to run above the process's priority, and keep it when the system refuses.
final class LoopPriorityTests: XCTestCase {
    /// The nice value of each of this process's threads whose name starts with `prefix` (from /proc).
    private func threadNices(named prefix: String) -> [Int32] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap { task -> Int32? in
            guard let comm = try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8),
                  comm.hasPrefix(prefix),
                  let stat = try? String(contentsOfFile: "/proc/self/task/\(task)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")")
            else { return nil }
            // After "pid (comm) ", field 3 is the state; the nice value is field 19.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            return fields.count > 16 ? Int32(fields[16]) : nil
        }
    }

    /// Whether this process may lower a thread's nice value below its own (root, `CAP_SYS_NICE`, `RLIMIT_NICE`),
    /// tried on a thread of its own.
    private func mayRaisePriority() throws -> Bool {
        let result = Locked(false)
        let thread = try startThread(name: "nice-probe") {
            let allowed = LoopPriority.raiseCurrentThread(by: 1)
            result.withLock { $0 = allowed }
        }
        pthread_join(thread, nil)
        return result.withLock { $0 }
    }

    func testTheLoopsRunAboveTheProcessWhenAllowedAndAtItsPriorityOtherwise() throws {
        let base = LoopPriority.currentNice()
        let allowed = try mayRaisePriority()
        let server = try TestServer { $0.eventLoopCount = 2; $0.eventLoopPriorityBoost = 3 }
        defer { server.stop() }
        server.assertHealthy()
        let nices = threadNices(named: "http-loop-")
        XCTAssertGreaterThanOrEqual(nices.count, 2)
        let expected = allowed ? max(-20, base - 3) : base
        XCTAssertEqual(Set(nices), [expected], "loops at \(nices), the test thread at \(base), raising allowed: \(allowed)")
    }

    func testNoBoostLeavesTheLoopsAtTheProcessPriority() throws {
        let base = LoopPriority.currentNice()
        let server = try TestServer { $0.eventLoopCount = 2; $0.eventLoopPriorityBoost = 0 }
        defer { server.stop() }
        server.assertHealthy()
        XCTAssertEqual(Set(threadNices(named: "http-loop-")), [base])
    }
}
