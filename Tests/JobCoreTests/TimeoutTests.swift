import Dispatch
import XCTest
@testable import JobCore

final class TimeoutTests: XCTestCase {
    private struct TimedOut: Error, Equatable {}

    func testTimeoutFailsUnfiredDeferredWithGivenError() {
        let clock = ManualScheduler()
        let d = Deferred()
        var seen: Failure?
        d.timeout(afterMilliseconds: 100, scheduler: clock) { TimedOut() }
        d.fail { failure in
            seen = failure
            return failure
        }
        clock.advance(byMilliseconds: 99)
        XCTAssertFalse(d.isCalled)
        clock.advance(byMilliseconds: 1)
        XCTAssertTrue(d.isCalled)
        XCTAssertEqual(seen?.error as? TimedOut, TimedOut())
        XCTAssertEqual(seen?.isCancellation, false)
        XCTAssertEqual(clock.pendingCount, 0)
    }

    func testTimeoutDoesNotFireWhenResultCameFirst() throws {
        let clock = ManualScheduler()
        let d = Deferred().timeout(afterMilliseconds: 100, scheduler: clock) { TimedOut() }
        XCTAssertEqual(clock.pendingCount, 1)
        clock.advance(byMilliseconds: 50)
        try d.takeResult("in time")
        XCTAssertEqual(clock.pendingCount, 0, "the timer is cancelled when the result arrives")
        clock.advance(byMilliseconds: 1_000)
        XCTAssertEqual(d.result as? String, "in time")
    }

    func testTimeoutCallsCancellerOfUnfiredDeferred() {
        let clock = ManualScheduler()
        var aborted = false
        let d = Deferred { d in
            aborted = true
            _ = try? d.takeError(Failure.cancellation())
        }
        d.timeout(afterMilliseconds: 10, scheduler: clock) { TimedOut() }
        clock.advance(byMilliseconds: 10)
        XCTAssertTrue(aborted)
        XCTAssertEqual((d.result as? Failure)?.error as? TimedOut, TimedOut())
    }

    func testTimeoutCancelsTheWaitedOnDeferred() throws {
        let clock = ManualScheduler()
        var innerCancelled = false
        let inner = Deferred { _ in innerCancelled = true }
        let d = Deferred()
        var trace: [String] = []
        d.then { _ in inner }
        d.fail { failure in
            trace.append(failure.error is TimedOut ? "timed out" : "other: \(failure)")
            return failure
        }
        d.timeout(afterMilliseconds: 100, scheduler: clock) { TimedOut() }
        try d.takeResult("start")
        XCTAssertTrue(d.isPaused)
        clock.advance(byMilliseconds: 100)
        XCTAssertTrue(innerCancelled)
        XCTAssertEqual((inner.result as? Failure)?.isCancellation, true, "the inner Deferred sees a plain cancellation")
        XCTAssertEqual(trace, ["timed out"], "this chain continues with the timeout error instead")
        XCTAssertFalse(d.isPaused)
    }

    func testTimerIsCancelledWhenWaitedOnDeferredArrivesInTime() throws {
        let clock = ManualScheduler()
        let inner = Deferred()
        let d = Deferred.withResult(nil)
        d.then { _ in inner }
        d.timeout(afterMilliseconds: 100, scheduler: clock) { TimedOut() }
        XCTAssertEqual(clock.pendingCount, 1)
        clock.advance(byMilliseconds: 60)
        try inner.takeResult("inner")
        XCTAssertEqual(clock.pendingCount, 0)
        clock.advance(byMilliseconds: 60)
        XCTAssertEqual(d.result as? String, "inner")
        XCTAssertFalse(inner.isPaused)
    }

    func testTimeoutOnFiredAndExhaustedDeferredCancelsTimerAtOnce() {
        let clock = ManualScheduler()
        let d = Deferred.withResult(1).timeout(afterMilliseconds: 5, scheduler: clock) { TimedOut() }
        XCTAssertEqual(clock.pendingCount, 0)
        clock.advance(byMilliseconds: 10)
        XCTAssertEqual(d.result as? Int, 1)
    }

    func testTimeoutOnDeferredListCancelsItsChildren() {
        let clock = ManualScheduler()
        var childCancelled = false
        let child = Deferred { _ in childCancelled = true }
        let list = DeferredList([child])
        list.cancelDeferredsWhenCancelled()
        list.timeout(afterMilliseconds: 30, scheduler: clock) { TimedOut() }
        clock.advance(byMilliseconds: 30)
        XCTAssertTrue(childCancelled)
        XCTAssertEqual((list.result as? Failure)?.error as? TimedOut, TimedOut())
        XCTAssertEqual((child.result as? Failure)?.isCancellation, true)
    }

    func testErrbackBeforeTimeoutCanRecover() {
        let clock = ManualScheduler()
        let d = Deferred()
        d.timeout(afterMilliseconds: 1, scheduler: clock) { TimedOut() }
        d.fail { failure in failure.error is TimedOut ? "fallback" : failure }
        clock.advance(byMilliseconds: 1)
        XCTAssertEqual(d.result as? String, "fallback")
    }

    func testTimerDoesNotKeepDeferredAlive() {
        let clock = ManualScheduler()
        weak var weakDeferred: Deferred?
        do {
            let d = Deferred().timeout(afterMilliseconds: 10, scheduler: clock) { TimedOut() }
            weakDeferred = d
        }
        XCTAssertNil(weakDeferred)
        clock.advance(byMilliseconds: 10)
    }

    func testTimeoutOnFinalizedDeferredIsRefused() throws {
        let clock = ManualScheduler()
        let d = Deferred.withResult(nil)
        try d.thenFinally { $0 }
        d.timeout(afterMilliseconds: 10, scheduler: clock) { TimedOut() }
        XCTAssertEqual(d.lastMisuse, .alreadyFinalized)
        XCTAssertEqual(clock.pendingCount, 0)
    }

    // MARK: ManualScheduler

    func testManualSchedulerRunsDueWorkInTimeOrderIncludingWorkScheduledByWork() {
        let clock = ManualScheduler()
        var trace: [String] = []
        _ = clock.schedule(afterMilliseconds: 30) { trace.append("30@\(clock.nowMilliseconds)") }
        _ = clock.schedule(afterMilliseconds: 10) {
            trace.append("10@\(clock.nowMilliseconds)")
            _ = clock.schedule(afterMilliseconds: 5) { trace.append("15@\(clock.nowMilliseconds)") }
            _ = clock.schedule(afterMilliseconds: 100) { trace.append("110@\(clock.nowMilliseconds)") }
        }
        _ = clock.schedule(afterMilliseconds: 10) { trace.append("10b@\(clock.nowMilliseconds)") }
        let cancelled = clock.schedule(afterMilliseconds: 20) { trace.append("cancelled") }
        cancelled.cancel()
        XCTAssertTrue(trace.isEmpty, "nothing runs before advance")
        clock.advance(byMilliseconds: 50)
        XCTAssertEqual(trace, ["10@10", "10b@10", "15@15", "30@30"])
        XCTAssertEqual(clock.nowMilliseconds, 50)
        XCTAssertEqual(clock.pendingCount, 1)
        clock.advance(byMilliseconds: 60)
        XCTAssertEqual(trace.last, "110@110")
        XCTAssertEqual(clock.pendingCount, 0)
    }

    // MARK: DispatchQueueScheduler

    func testDispatchQueueSchedulerRunsWorkUnlessCancelled() {
        let queue = DispatchQueue(label: "TimeoutTests.scheduler")
        let scheduler = DispatchQueueScheduler(queue: queue)
        let ran = expectation(description: "scheduled work ran")
        var cancelledRan = false
        let cancelled = scheduler.schedule(afterMilliseconds: 5) { cancelledRan = true }
        cancelled.cancel()
        _ = scheduler.schedule(afterMilliseconds: 20) {
            dispatchPrecondition(condition: .onQueue(queue))
            ran.fulfill()
        }
        wait(for: [ran], timeout: 5)
        queue.sync {
            XCTAssertFalse(cancelledRan)
        }
    }

    func testTimeoutWithDispatchQueueScheduler() {
        let queue = DispatchQueue(label: "TimeoutTests.deferreds")
        let scheduler = DispatchQueueScheduler(queue: queue)
        let failed = expectation(description: "timed out")
        var d: Deferred?
        queue.sync {
            let deferred = Deferred()
            deferred.timeout(afterMilliseconds: 10, scheduler: scheduler) { TimedOut() }
            deferred.fail { failure in
                XCTAssertTrue(failure.error is TimedOut)
                failed.fulfill()
                return nil
            }
            d = deferred
        }
        wait(for: [failed], timeout: 5)
        queue.sync {
            XCTAssertEqual(d?.isCalled, true)
            d = nil
        }
    }
}
