import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif
@testable import JobCore

/// An error carrying a string, standing in for the strings the Objective-C tests fail with.
struct Message: Error, Equatable {
    let text: String
    init(_ text: String) { self.text = text }
}

/// The string inside a failure made from a `Message`, like `[failure value]` in the original tests.
func value(_ failure: Failure?) -> String? {
    (failure?.error as? Message)?.text
}

/// Runs `body` on a thread with a small stack (256 KiB), so that recursion proportional to a
/// chain's length would crash the test instead of passing unnoticed on the main thread's 8 MiB.
func onSmallStack(_ body: @escaping () -> Void, file: StaticString = #filePath, line: UInt = #line) {
    // nonisolated(unsafe): `body` runs on the new thread while this one waits for `done`, so what it captures from
    // the caller is never used by two threads at once (but after a timeout, which has failed the test).
    nonisolated(unsafe) let body = body
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        body()
        done.signal()
    }
    thread.stackSize = 256 * 1024
    thread.start()
    XCTAssertEqual(done.wait(timeout: .now() + 30), .success, "small-stack body did not finish", file: file, line: line)
}

final class DeferredTests: XCTestCase {
    // MARK: Twins of HLDeferredTest.m

    func testAllocInitDealloc() {
        weak var released: Deferred?
        do {
            let d = Deferred()
            XCTAssertNotNil(d)
            released = d
        }
        XCTAssertNil(released)
    }

    func testOneCallback() throws {
        let d = Deferred()
        var success = false
        var blockResult: Any?
        d.then { result in
            success = true
            blockResult = result
            return result
        }
        try d.takeResult("success")
        XCTAssertTrue(success, "callback did not run")
        XCTAssertEqual(blockResult as? String, "success", "unexpected callback result")
    }

    func testMultipleCallbacks() throws {
        let d = Deferred()
        var callbackCount = 0
        var count = 0
        d.then { result in
            callbackCount += 1
            XCTAssertEqual(result as? String, "starting", "unexpected callback result")
            return "first"
        }
        count += 1
        d.then { result in
            callbackCount += 1
            XCTAssertEqual(result as? String, "first", "unexpected callback result")
            return "second"
        }
        count += 1
        d.then { result in
            callbackCount += 1
            XCTAssertEqual(result as? String, "second", "unexpected callback result")
            return "blah"
        }
        count += 1
        try d.takeResult("starting")
        XCTAssertEqual(count, callbackCount, "count doesn't equal callbackCount")
        var failed: Failure?
        d.fail { failure in
            failed = failure
            return failure
        }
        XCTAssertNil(failed, "\(String(describing: failed))")
    }

    func testOneErrback() throws {
        let d = Deferred()
        var success = false
        d.fail { failure in
            success = true
            XCTAssertEqual(value(failure), "success", "unexpected errback result")
            return failure
        }
        try d.takeError(Message("success"))
        XCTAssertTrue(success, "errback did not run")
    }

    func testMultipleErrbacks() throws {
        let d = Deferred()
        var errbackCount = 0
        var count = 0
        for _ in 0..<3 {
            d.fail { failure in
                errbackCount += 1
                XCTAssertEqual(value(failure), "starting", "unexpected callback result")
                return failure
            }
            count += 1
        }
        try d.takeError(Message("starting"))
        XCTAssertEqual(count, errbackCount, "count doesn't equal errbackCount")
        var blockResult: Any?
        d.then { result in
            blockResult = result
            return result
        }
        XCTAssertNil(blockResult, "\(String(describing: blockResult))")
    }

    func testSwitchingBetweenCallbacksAndErrbacks() throws {
        let d = Deferred()
        var ran = ""
        d.then({ _ in
            ran += "c"
            return Failure(Message("ok"))
        }, fail: { failure in
            XCTFail("errback should not have been called")
            return failure
        })
        d.then({ result in
            XCTFail("callback should not have been called")
            return result
        }, fail: { failure in
            ran += "e"
            XCTAssertEqual(value(failure), "ok", "expected ok from previous callback")
            return "ok"
        })
        d.then({ result in
            ran += "c"
            XCTAssertEqual(result as? String, "ok", "expected ok from previous errback")
            return result
        }, fail: { failure in
            XCTFail("errback should not have been called")
            return failure
        })
        var failed: Failure?
        d.fail { failure in
            failed = failure
            return failure
        }
        // The original never fires this Deferred, so its link assertions never run; fire it here.
        try d.takeResult("starting")
        XCTAssertEqual(ran, "cec")
        XCTAssertNil(failed, "\(String(describing: failed))")
    }

    func testRaisingExceptionsInCallbacks() throws {
        let d = Deferred()
        var success = false
        d.then { _ in
            throw Message("TestException")
        }
        d.fail { failure in
            success = true
            return failure
        }
        try d.takeResult("starting")
        XCTAssertTrue(success, "errback should have been called")
        var blockResult: Any?
        d.then { result in
            blockResult = result
            return result
        }
        XCTAssertNil(blockResult, "\(String(describing: blockResult))")
    }

    func testPausing() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        var x = 0
        d1.then { _ in
            XCTAssertEqual(0, x)
            x += 1
            return d2
        }
        d2.then { _ in
            XCTAssertEqual(1, x)
            x += 1
            return "ok"
        }
        d2.then { result in
            XCTAssertEqual(2, x)
            XCTAssertEqual(result as? String, "ok")
            x += 1
            return "d2-second"
        }
        // This must not run until d2 fires.
        d1.then { result in
            XCTAssertEqual(3, x)
            XCTAssertEqual(result as? String, "d2-second")
            x += 1
            return "d1-second"
        }
        XCTAssertEqual(x, 0)
        try d1.takeResult("starting")
        try d2.takeResult("starting")
        d1.then { result in
            XCTAssertEqual(4, x)
            XCTAssertEqual(result as? String, "d1-second")
            x += 1
            return "d1-third"
        }
        d2.then { result in
            XCTAssertEqual(5, x)
            XCTAssertEqual(result as? String, "d2-second")
            x += 1
            return "d2-third"
        }
        var failed: Failure?
        d1.fail { failure in
            failed = failure
            return failure
        }
        XCTAssertNil(failed, "\(String(describing: failed))")
        failed = nil
        d2.fail { failure in
            failed = failure
            return failure
        }
        XCTAssertNil(failed, "\(String(describing: failed))")
        XCTAssertEqual(x, 6)
    }

    func testNotifying() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        var checks = 0
        d1.then { result in
            checks += 1
            XCTAssertEqual(result as? String, "starting")
            return "d1-result"
        }
        d1.notify(d2)
        d2.then { result in
            checks += 1
            XCTAssertEqual(result as? String, "d1-result")
            return "d2-result-after-d1-notified-d2"
        }
        d1.then { result in
            checks += 1
            XCTAssertEqual(result as? String, "d1-result")
            return result
        }
        d2.then { result in
            checks += 1
            XCTAssertEqual(result as? String, "d2-result-after-d1-notified-d2")
            return result
        }
        try d1.takeResult("starting")
        let d3 = Deferred.observing(d2)
        XCTAssertNotNil(d3)
        d3.then { result in
            checks += 1
            XCTAssertEqual(result as? String, "d2-result-after-d1-notified-d2")
            return result
        }
        var failed: Failure?
        for d in [d1, d2, d3] {
            failed = nil
            d.fail { failure in
                failed = failure
                return failure
            }
            XCTAssertNil(failed, "\(String(describing: failed))")
        }
        XCTAssertEqual(checks, 5)
    }

    func testCancel() {
        var cancellerCalled = false
        let d = Deferred { deferred in
            cancellerCalled = true
            _ = try? deferred.takeError(Failure.cancellation())
        }
        XCTAssertFalse(cancellerCalled, "canceller was called prematurely")
        var success = false
        var theFailure: Failure?
        d.fail { failure in
            success = true
            theFailure = failure
            return failure
        }
        XCTAssertFalse(success, "errback run too soon")
        d.cancel()
        XCTAssertTrue(success, "errback should have run")
        XCTAssertEqual(theFailure?.isCancellation, true, "errback should have been run with the cancellation failure")
        XCTAssertTrue(cancellerCalled, "canceller was not called")
    }

    func testFinalizerNoCallbacks() throws {
        let d = Deferred()
        var success = false
        try d.thenFinally { result in
            success = true
            XCTAssertEqual(result as? String, "success", "unexpected callback result")
            return result
        }
        try d.takeResult("success")
        XCTAssertTrue(success, "callback did not run")
    }

    func testFinalizerOneCallback() throws {
        let d = Deferred()
        var s = ""
        try d.thenFinally { result in
            XCTAssertEqual(result as? String, "success", "unexpected callback result")
            s += "f"
            return result
        }
        d.then { result in
            XCTAssertEqual(result as? String, "success", "unexpected callback result")
            s += "c"
            return result
        }
        var failed: Failure?
        d.fail { failure in
            failed = failure
            return failure
        }
        try d.takeResult("success")
        XCTAssertFalse(s.isEmpty, "callback did not run")
        XCTAssertEqual(s, "cf", "callback should have run, then finalizer")
        XCTAssertNil(failed, "\(String(describing: failed))")
    }

    func testTwoFinalizersThrows() throws {
        let d = Deferred()
        try d.thenFinally { $0 }
        XCTAssertThrowsError(try d.thenFinally { $0 }, "should have thrown as there was already a finalizer") { error in
            XCTAssertEqual(error as? DeferredError, .alreadyFinalized)
        }
        try d.takeResult("")
    }

    func testFinalizerAfterRunThrows() throws {
        let d = Deferred()
        try d.thenFinally { $0 }
        try d.takeResult("")
        XCTAssertThrowsError(try d.thenFinally { $0 }, "should have thrown as the Deferred already ran") { error in
            XCTAssertEqual(error as? DeferredError, .alreadyFinalized)
        }
    }

    // MARK: Beyond the original tests

    func testTakeResultTwiceThrowsAlreadyCalled() throws {
        let d = Deferred()
        try d.takeResult(1)
        XCTAssertThrowsError(try d.takeResult(2)) { XCTAssertEqual($0 as? DeferredError, .alreadyCalled) }
        XCTAssertThrowsError(try d.takeError(Message("late"))) { XCTAssertEqual($0 as? DeferredError, .alreadyCalled) }
        XCTAssertEqual(d.result as? Int, 1)
        XCTAssertEqual(d.lastMisuse, .alreadyCalled)
    }

    func testFireAfterCancelWithoutCancellerIsIgnoredOnce() throws {
        let d = Deferred()
        d.cancel()
        XCTAssertTrue(d.isCalled)
        XCTAssertEqual((d.result as? Failure)?.isCancellation, true)
        XCTAssertNoThrow(try d.takeResult("late"))
        XCTAssertEqual((d.result as? Failure)?.isCancellation, true)
        XCTAssertThrowsError(try d.takeResult("later")) { XCTAssertEqual($0 as? DeferredError, .alreadyCalled) }
    }

    func testCancellerThatDoesNotFireLeavesCancellationAndLaterFireThrows() throws {
        var cancellerCalls = 0
        let d = Deferred { _ in cancellerCalls += 1 }
        var seen: Failure?
        d.fail { failure in
            seen = failure
            return nil
        }
        d.cancel()
        d.cancel()
        XCTAssertEqual(cancellerCalls, 1)
        XCTAssertEqual(seen?.isCancellation, true)
        XCTAssertThrowsError(try d.takeResult("late")) { XCTAssertEqual($0 as? DeferredError, .alreadyCalled) }
    }

    func testCancellerThatFiresWithResultWins() {
        let d = Deferred { deferred in _ = try? deferred.takeResult("partial") }
        d.cancel()
        XCTAssertEqual(d.result as? String, "partial")
    }

    func testErrbackReturningValueSwitchesBackToCallbacks() throws {
        let d = Deferred()
        var trace: [String] = []
        d.fail { failure in
            trace.append("fail:\(value(failure) ?? "?")")
            return "recovered"
        }
        d.then { result in
            trace.append("then:\(result as? String ?? "?")")
            return result
        }
        d.fail { _ in
            trace.append("second fail")
            return nil
        }
        try d.takeError(Message("boom"))
        XCTAssertEqual(trace, ["fail:boom", "then:recovered"])
        XCTAssertEqual(d.result as? String, "recovered")
    }

    func testCallbackThrowingSwitchesToErrbackWithThatError() throws {
        let d = Deferred()
        var skipped = true
        var seen: Failure?
        d.then { _ in throw Message("thrown") }
        d.then { result in
            skipped = false
            return result
        }
        d.fail { failure in
            seen = failure
            return failure
        }
        try d.takeResult("start")
        XCTAssertTrue(skipped)
        XCTAssertEqual(value(seen), "thrown")
        XCTAssertEqual(value(d.result as? Failure), "thrown")
    }

    func testThrowingAFailureKeepsThatFailure() throws {
        let original = Failure(Message("kept"))
        let d = Deferred.withResult(nil)
        d.then { _ in throw original }
        XCTAssertTrue((d.result as? Failure) === original)
    }

    func testFailureNeverNests() {
        let inner = Failure(Message("x"))
        let outer = Failure(inner)
        XCTAssertEqual(value(outer), "x")
        XCTAssertFalse(outer.error is Failure)
        XCTAssertTrue(Failure.cancellation().isCancellation)
        XCTAssertFalse(Failure(Message("x")).isCancellation)
    }

    func testWithResultWithErrorAndThenReturn() {
        let d = Deferred.withResult("a").thenReturn("b")
        XCTAssertTrue(d.isCalled)
        XCTAssertEqual(d.result as? String, "b")
        let e = Deferred.withError(Message("bad")).thenReturn("ignored")
        XCTAssertEqual(value(e.result as? Failure), "bad")
        let failure = Failure(Message("same"))
        XCTAssertTrue(Deferred.withError(failure).result as? Failure === failure)
    }

    func testBothSeesResultAndFailure() throws {
        var seen: [String] = []
        let ok = Deferred()
        ok.both { result in
            seen.append(result is Failure ? "failure" : "result")
            return result
        }
        try ok.takeResult(1)
        let bad = Deferred()
        bad.both { result in
            seen.append(result is Failure ? "failure" : "result")
            return result
        }
        try bad.takeError(Message("x"))
        XCTAssertEqual(seen, ["result", "failure"])
    }

    func testCallbackReturningFiredDeferredTakesItsResultAtOnce() throws {
        let d = Deferred()
        d.then { _ in Deferred.withResult("inner") }
        try d.takeResult("outer")
        XCTAssertFalse(d.isPaused)
        XCTAssertEqual(d.result as? String, "inner")
    }

    func testCallbackReturningFailedDeferredContinuesOnErrorPath() throws {
        let inner = Deferred()
        let d = Deferred.withResult(nil)
        var seen: Failure?
        d.then { _ in inner }
        d.fail { failure in
            seen = failure
            return "handled"
        }
        XCTAssertTrue(d.isPaused)
        XCTAssertTrue(d.result as? Deferred === inner)
        try inner.takeError(Message("inner failed"))
        XCTAssertEqual(value(seen), "inner failed")
        XCTAssertEqual(d.result as? String, "handled")
        XCTAssertFalse(d.isPaused)
    }

    func testCallbackReturningItsOwnDeferredFails() throws {
        let d = Deferred()
        d.then { _ in d }
        try d.takeResult(nil)
        XCTAssertEqual((d.result as? Failure)?.error as? DeferredError, .chainedToItself)
    }

    func testCancelOfPausedChainCancelsTheAwaitedDeferred() throws {
        var innerCancelled = false
        let inner = Deferred { _ in innerCancelled = true }
        let outer = Deferred()
        outer.then { _ in inner }
        var seen: Failure?
        outer.fail { failure in
            seen = failure
            return failure
        }
        try outer.takeResult("go")
        XCTAssertTrue(outer.isPaused)
        outer.cancel()
        XCTAssertTrue(innerCancelled)
        XCTAssertEqual(inner.isCalled, true)
        XCTAssertEqual(seen?.isCancellation, true)
        XCTAssertFalse(outer.isPaused)
    }

    func testCancelOfPausedChainReachesTheInnermostDeferred() throws {
        var innermostCancelled = false
        let innermost = Deferred { _ in innermostCancelled = true }
        let middle = Deferred.withResult(nil)
        middle.then { _ in innermost }
        let outer = Deferred.withResult(nil)
        outer.then { _ in middle }
        XCTAssertTrue(outer.isPaused)
        outer.cancel()
        XCTAssertTrue(innermostCancelled)
        XCTAssertEqual((outer.result as? Failure)?.isCancellation, true)
    }

    func testCancelOfSettledDeferredDoesNothing() throws {
        let d = Deferred.withResult("done")
        d.cancel()
        XCTAssertEqual(d.result as? String, "done")
    }

    func testNotifyRefusesFiredOrAlreadyChainedDeferred() {
        let source = Deferred()
        let fired = Deferred.withResult(1)
        source.notify(fired)
        XCTAssertEqual(source.lastMisuse, .alreadyCalled)
        let target = Deferred()
        source.notify(target)
        Deferred().notify(target)
        XCTAssertEqual(source.lastMisuse, .alreadyCalled)
        let other = Deferred()
        other.notify(target)
        XCTAssertEqual(other.lastMisuse, .alreadyChained)
    }

    func testObserverCannotChangeObservedResult() throws {
        let source = Deferred()
        let observer = Deferred.observing(source)
        observer.then { _ in "changed by observer" }
        try source.takeResult("original")
        XCTAssertEqual(source.result as? String, "original")
        XCTAssertEqual(observer.result as? String, "changed by observer")
    }

    func testObservingFailure() throws {
        let source = Deferred()
        let observer = Deferred.observing(source)
        try source.takeError(Message("bad"))
        XCTAssertEqual(value(observer.result as? Failure), "bad")
    }

    // MARK: Finalizers

    func testFinalizerRunsAfterLinksAddedAfterItAndAfterPause() throws {
        var order: [String] = []
        let inner = Deferred()
        let d = Deferred()
        try d.bothFinally { result in
            order.append("finally:\(result as? String ?? "?")")
            return result
        }
        d.then { _ in
            order.append("first")
            return inner
        }
        d.then { result in
            order.append("second:\(result as? String ?? "?")")
            return "end"
        }
        try d.takeResult("start")
        XCTAssertEqual(order, ["first"], "finalizer must wait while the chain is paused")
        XCTAssertFalse(d.isFinalized)
        try inner.takeResult("inner")
        XCTAssertEqual(order, ["first", "second:inner", "finally:end"])
        XCTAssertTrue(d.isFinalized)
    }

    func testFinalizerAddedToExhaustedChainRunsAtOnce() throws {
        let d = Deferred.withResult(7)
        var ran = 0
        try d.thenFinally { result in
            ran += 1
            return result
        }
        XCTAssertEqual(ran, 1)
    }

    func testLinksAfterFinalizationAreRefused() throws {
        let d = Deferred()
        var finalizerRuns = 0
        try d.thenFinally { result in
            finalizerRuns += 1
            return result
        }
        try d.takeResult("x")
        var ran = false
        d.then { result in
            ran = true
            return result
        }
        XCTAssertFalse(ran)
        XCTAssertEqual(d.lastMisuse, .alreadyFinalized)
        d.notify(Deferred())
        XCTAssertEqual(d.lastMisuse, .alreadyFinalized)
        XCTAssertThrowsError(try d.failFinally { $0 }) { XCTAssertEqual($0 as? DeferredError, .alreadyFinalized) }
        XCTAssertThrowsError(try d.takeResult("again")) { XCTAssertEqual($0 as? DeferredError, .alreadyFinalized) }
        XCTAssertEqual(finalizerRuns, 1)
    }

    func testFailFinallyRunsOnlyOnFailureAndThenFinallyOnlyOnResult() throws {
        var trace: [String] = []
        let ok = Deferred()
        try ok.failFinally { failure in
            trace.append("ok-fail")
            return failure
        }
        try ok.takeResult(1)
        let bad = Deferred()
        try bad.thenFinally({ result in
            trace.append("bad-then")
            return result
        }, failFinally: { failure in
            trace.append("bad-fail:\(value(failure) ?? "?")")
            return nil
        })
        try bad.takeError(Message("e"))
        XCTAssertEqual(trace, ["bad-fail:e"])
        XCTAssertTrue(ok.isFinalized)
        XCTAssertNil(bad.result)
    }

    // MARK: Depth and length

    func testChainOfTenThousandNestedDeferredsDoesNotOverflowStack() {
        let count = 10_000
        var finalResult: Any?
        var resumed = 0
        onSmallStack {
            let deferreds = (0...count).map { _ in Deferred() }
            for index in 0..<count {
                let next = deferreds[index + 1]
                deferreds[index].then { _ in next }
                deferreds[index].then { result in
                    resumed += 1
                    return result
                }
            }
            for index in 0..<count {
                _ = try? deferreds[index].takeResult(index)
            }
            XCTAssertTrue(deferreds[0].isPaused)
            // Firing the innermost resumes all 10,000 paused chains, outermost last.
            _ = try? deferreds[count].takeResult("innermost")
            finalResult = deferreds[0].result
        }
        XCTAssertEqual(resumed, count)
        XCTAssertEqual(finalResult as? String, "innermost")
    }

    func testNotifyChainOfTenThousandDeferredsDoesNotOverflowStack() {
        let count = 10_000
        var last: Any?
        onSmallStack {
            let deferreds = (0...count).map { _ in Deferred() }
            for index in 0..<count {
                deferreds[index].notify(deferreds[index + 1])
            }
            _ = try? deferreds[0].takeResult("first")
            last = deferreds[count].result
        }
        XCTAssertEqual(last as? String, "first")
    }

    func testTenThousandLinksOnOneChain() throws {
        let count = 10_000
        var result: Any?
        onSmallStack {
            let d = Deferred()
            for index in 0..<count {
                if index % 3 == 1 {
                    // Already-fired inner Deferreds are taken without pausing.
                    d.then { value in Deferred.withResult((value as? Int ?? 0) + 1) }
                } else if index % 3 == 2 {
                    d.then { value in Failure(Message(String((value as? Int ?? 0) + 1))) }
                } else {
                    d.fail { failure in Int(value(failure) ?? "") ?? -1 }
                    d.then { value in (value as? Int ?? 0) + 0 }
                }
            }
            _ = try? d.takeResult(0)
            result = d.result
        }
        // Every group of three links adds 2 (the errback link adds nothing); 10,000 = 3 * 3333 + 1.
        XCTAssertEqual(result as? Int, 2 * 3333)
    }

    func testTenThousandDeferredsPausedOnOneDeferred() throws {
        let shared = Deferred()
        let waiting = (0..<10_000).map { _ in Deferred.withResult(nil).then { _ in shared } }
        XCTAssertTrue(waiting.allSatisfy { $0.isPaused })
        var outcome: [Any?] = []
        onSmallStack {
            _ = try? shared.takeResult("shared")
            outcome = waiting.map { $0.result }
        }
        XCTAssertEqual(outcome.compactMap { $0 as? String }.count, 10_000)
    }

    func testReleasingLongUnfiredNotifyChainDoesNotOverflowStack() {
        weak var last: Deferred?
        onSmallStack {
            var first: Deferred? = Deferred()
            var current = first
            for _ in 0..<100_000 {
                let next = Deferred()
                current?.notify(next)
                current = next
            }
            last = current
            current = nil
            XCTAssertNotNil(last)
            first = nil
        }
        XCTAssertNil(last)
    }

    // MARK: Memory

    func testSettledPausedChainIsReleased() throws {
        weak var weakOuter: Deferred?
        weak var weakInner: Deferred?
        weak var weakObserver: Deferred?
        do {
            let inner = Deferred()
            let outer = Deferred.withResult(nil)
            outer.then { _ in inner }
            let observer = Deferred.observing(outer)
            XCTAssertTrue(outer.isPaused)
            try inner.takeResult("done")
            XCTAssertEqual(observer.result as? String, "done")
            weakOuter = outer
            weakInner = inner
            weakObserver = observer
        }
        XCTAssertNil(weakOuter)
        XCTAssertNil(weakInner)
        XCTAssertNil(weakObserver)
    }

    func testLinksAreReleasedWhenChainIsExhausted() throws {
        final class Token {}
        weak var weakToken: Token?
        let d = Deferred()
        do {
            let token = Token()
            weakToken = token
            d.then { result in
                _ = token
                return result
            }
        }
        XCTAssertNotNil(weakToken)
        try d.takeResult(nil)
        XCTAssertNil(weakToken)
    }

    func testCancellerIsReleasedWhenFired() throws {
        final class Token {}
        weak var weakToken: Token?
        let d: Deferred
        do {
            let token = Token()
            weakToken = token
            d = Deferred { _ in _ = token }
        }
        XCTAssertNotNil(weakToken)
        try d.takeResult(nil)
        XCTAssertNil(weakToken)
    }

    #if canImport(Glibc)
    func testIdleDeferredIsSmall() {
        // malloc.h is not part of the Glibc module; look the function up in the process instead.
        typealias UsableSize = @convention(c) (UnsafeMutableRawPointer?) -> Int
        guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "malloc_usable_size") else {
            XCTFail("malloc_usable_size not found")
            return
        }
        let usableSize = unsafeBitCast(symbol, to: UsableSize.self)
        let deferreds = (0..<16).map { _ in Deferred() }
        for d in deferreds {
            let bytes = usableSize(Unmanaged.passUnretained(d).toOpaque())
            XCTAssertLessThan(bytes, 256, "an idle Deferred takes \(bytes) bytes")
        }
    }
    #endif
}

extension DeferredTests {
    func testCancelledObserverFailsAtOnceAndIgnoresTheSource() throws {
        let source = Deferred()
        let observer = Deferred.observing(source)
        var seen: Failure?
        observer.fail { failure in
            seen = failure
            return failure
        }
        observer.cancel()
        XCTAssertEqual(seen?.isCancellation, true)
        XCTAssertFalse(observer.isPaused)
        try source.takeResult("source")
        XCTAssertEqual((observer.result as? Failure)?.isCancellation, true)
        XCTAssertEqual(source.result as? String, "source")
    }

    func testDirectlyFiredNotifyTargetKeepsItsValue() throws {
        let source = Deferred()
        let target = Deferred()
        source.notify(target)
        var trace: [String] = []
        target.then { result in
            trace.append(result as? String ?? "?")
            return result
        }
        try target.takeResult("direct")
        try source.takeResult("source")
        XCTAssertEqual(trace, ["direct"])
        XCTAssertThrowsError(try target.takeResult("again")) { XCTAssertEqual($0 as? DeferredError, .alreadyCalled) }
    }

    func testTimeoutOnObserverFiresWithoutTouchingTheSource() {
        struct TimedOut: Error {}
        let clock = ManualScheduler()
        let source = Deferred()
        let observer = Deferred.observing(source).timeout(afterMilliseconds: 5, scheduler: clock) { TimedOut() }
        clock.advance(byMilliseconds: 5)
        XCTAssertTrue((observer.result as? Failure)?.error is TimedOut)
        XCTAssertFalse(source.isCalled)
    }

    /// The casts the chains make answer as `as?` does, for every kind of value a chain carries.
    func testClassCastAnswersAsAsDoesWithoutBridging() {
        let failure = Failure(DeferredError.cancelled)
        let list = DeferredList([])
        let plain = Deferred()
        XCTAssertTrue(Failure.from(failure) === failure)
        XCTAssertNil(Deferred.from(failure))
        XCTAssertTrue(Deferred.from(list) === list, "a subclass is a Deferred")
        XCTAssertTrue(Deferred.from(plain) === plain)
        XCTAssertNil(Failure.from(plain))
        let results: [Any?] = [JSONValue.string("a"), failure, nil]
        for value: Any? in [JSONValue.null, JSONValue.array([.string("x")]), results, [JSONValue.null], "text", 1, nil] {
            XCTAssertNil(Failure.from(value))
            XCTAssertNil(Deferred.from(value))
        }
        // A value that holds an optional holding a Deferred is one, as `as?` says.
        let wrapped: Deferred? = plain
        let nested: Any? = .some(wrapped as Any)
        XCTAssertTrue(Deferred.from(nested) === plain)
        XCTAssertTrue((nested as? Deferred) === plain)
        // A list's results (`[Any?]`) with failures in them go down the callback path, not the errback's.
        let child = Deferred()
        let parent = DeferredList([child])
        var seen: Any?
        parent.then { value in
            seen = value
            return value
        }
        _ = try? child.takeError(failure)
        XCTAssertTrue(((seen as? [Any?])?.first ?? nil) as? Failure === failure)
    }
}
