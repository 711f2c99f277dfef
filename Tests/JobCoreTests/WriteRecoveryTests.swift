import Threads
import XCTest
@testable import JobCore

/// The policy both store writers share, without a database: the delay between tries while writes fail, the spell a
/// commit ends, and how commits and flushes learn of changes given up or of the writer closing. The writers' tests
/// (`StoreFailurePolicyTests`, `PostgresStoreFailureTests`, `StoreUnavailableTests`) drive it through real failures.
final class WriteRecoveryTests: XCTestCase {
    private let lines = Watched<[JSONValue]>([])

    private var logger: Logger {
        Logger(label: "test", minimumLevel: .debug) { [lines] line in
            if let value = try? JSONValue.parse(line.dropLast()) { lines.withLock { $0.append(value) } }
        }
    }

    private var logged: [JSONValue] { lines.withLock { $0 } }

    private func result(_ ticket: WriteTicket<Void>) -> StoreError? {
        do {
            try ticket.wait()
            return nil
        } catch {
            return error as? StoreError
        }
    }

    func testTheDelayDoublesUpToTheMostAndACommitThatLeavesNothingPendingEndsTheSpell() {
        var recovery = WriteRecovery()
        let logger = self.logger
        XCTAssertNil(recovery.retryWaitMs)
        let busy = StoreError(.unavailable, "database is locked")
        for _ in 0..<8 { recovery.degrade(busy, records: 3, logger: logger) }
        XCTAssertEqual(logged.map { $0["msg"]?.stringValue }, [
            "store writes are failing; state changes are kept and retried",
        ] + Array(repeating: "store write retry failed", count: 7))
        XCTAssertEqual(logged.first?["records"], .int(3))
        XCTAssertEqual(logged.dropFirst().map { $0["next_retry_ms"] }, [100, 200, 400, 800, 1600, 3200, 5000].map { .int($0) })
        XCTAssertEqual(recovery.failure, busy)
        XCTAssertLessThanOrEqual(recovery.retryWaitMs ?? .max, WriteRecovery.maxRetryMs)

        // A commit that leaves changes pending ends nothing; one that leaves none ends the spell, once.
        XCTAssertNil(recovery.committed(nothingPending: false))
        XCTAssertEqual(recovery.failure, busy)
        XCTAssertEqual(recovery.committed(nothingPending: true), busy)
        XCTAssertNil(recovery.failure)
        XCTAssertNil(recovery.retryWaitMs)
        XCTAssertNil(recovery.failureBeforeRetry)
        XCTAssertNil(recovery.committed(nothingPending: true))

        // The next spell starts again from the first delay, with an error line.
        recovery.degrade(busy, records: 1, logger: logger)
        XCTAssertEqual(logged.last?["msg"]?.stringValue, "store writes are failing; state changes are kept and retried")
        XCTAssertLessThanOrEqual(recovery.retryWaitMs ?? .max, WriteRecovery.firstRetryMs)
    }

    func testChangesGivenUpAreToldToTheCommitsWaitingAndToTheNextFlushOnce() {
        var recovery = WriteRecovery()
        let status = WriterStatus()
        let waiting = WriteTicket<Void>()
        recovery.awaitCommit(waiting)
        let bug = StoreError(.io, "constraint failed")
        recovery.gaveUp(bug, records: 4, status: status, logger: logger)
        XCTAssertEqual(result(waiting), bug)
        XCTAssertEqual(status.health.droppedChanges, 4)
        XCTAssertEqual(logged.last?["msg"]?.stringValue, "store gave up state changes it cannot write")

        let firstFlush = WriteTicket<Void>()
        let secondFlush = WriteTicket<Void>()
        recovery.answerFlush(firstFlush)
        recovery.answerFlush(secondFlush)
        XCTAssertEqual(result(firstFlush), bug)
        XCTAssertNil(result(secondFlush))

        // Commits waiting after that are answered by the next commit, with success.
        let later = WriteTicket<Void>()
        recovery.awaitCommit(later)
        recovery.answerCommitWaiters(.success(()))
        XCTAssertNil(result(later))
    }

    func testClosingAnswersTheCommitsStillWaitingAndLogsOnlyWhatItCouldNotWrite() {
        var recovery = WriteRecovery()
        let waiting = WriteTicket<Void>()
        recovery.awaitCommit(waiting)
        recovery.close(unwritten: 0, logger: logger)
        XCTAssertEqual(result(waiting)?.kind, .closed)
        XCTAssertTrue(logged.isEmpty)

        recovery.close(unwritten: 2, logger: logger)
        XCTAssertEqual(logged.map { $0["records"] }, [.int(2)])
    }

    func testTheStatusShowsTheFailureAndThePendingRecords() {
        var recovery = WriteRecovery()
        let status = WriterStatus()
        let full = StoreError(.io, "database or disk is full")
        recovery.degrade(full, records: 5, logger: logger)
        recovery.publish(to: status, pending: 5)
        XCTAssertEqual(status.health.degraded, true)
        XCTAssertEqual(status.health.lastError, full)
        XCTAssertEqual(status.health.pendingChanges, 5)

        _ = recovery.committed(nothingPending: true)
        recovery.publish(to: status, pending: 0)
        XCTAssertEqual(status.health.degraded, false)
        XCTAssertNil(status.health.lastError)
        XCTAssertEqual(status.health.pendingChanges, 0)
    }
}
