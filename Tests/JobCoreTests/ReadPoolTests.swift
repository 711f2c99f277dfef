import Foundation
import Threads
import XCTest
@testable import JobCore

/// The read pool runs below the priority of the thread that made it (an event loop's), so that rendering a large
/// answer yields the CPU to the loops.
final class ReadPoolTests: XCTestCase {
    func testReadsRunFiveNiceStepsBelowTheThreadThatMadeThePool() {
        let pool = ReadPool(queues: 3)
        // `Locked`, not `Synchronization.Mutex`, which ThreadSanitizer on this toolchain does not see.
        let seen = Locked<[Int32]>([])
        let done = DispatchGroup()
        for _ in 0..<6 {
            done.enter()
            pool.async {
                let nice = currentThreadNice()
                seen.withLock { $0.append(nice) }
                done.leave()
            }
        }
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success)
        // The test's own thread stands for an event loop: a plain thread at the process's nice value. (libdispatch
        // alone would run `.utility` work at nice 2 whatever the process's, above a process started with `nice`.)
        let plain = currentThreadNice()
        let values = seen.withLock { $0 }
        XCTAssertEqual(values.count, 6)
        XCTAssertEqual(pool.nice, min(19, plain + ReadPool.niceIncrement))
        for value in values {
            XCTAssertEqual(value, pool.nice, "a read ran at nice \(value), the thread that made the pool at \(plain)")
        }
    }
}
