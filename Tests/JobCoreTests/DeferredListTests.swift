import XCTest
@testable import JobCore

final class DeferredListTests: XCTestCase {
    // MARK: Twins of HLDeferredListTest.m

    func testAllocInitDealloc() {
        weak var released: DeferredList?
        do {
            let d = DeferredList([])
            XCTAssertNotNil(d)
            released = d
        }
        XCTAssertNil(released)
    }

    func testFireOnFirstResultEmptyList() {
        let d = DeferredList([], fireOnFirstResult: true)
        XCTAssertFalse(d.isCalled, "empty DeferredList shouldn't immediately resolve if fireOnFirstResult is true")
    }

    func testFireOnFirstResultOnCreation() {
        let d1 = Deferred.withResult("ok")
        let d2 = Deferred()
        let d = DeferredList([d1, d2], fireOnFirstResult: true)
        XCTAssertTrue(d.isCalled, "DeferredList with results should immediately resolve if fireOnFirstResult is true")
        XCTAssertEqual(d.result as? String, "ok")
        // d2 never fires: it and the list hold each other until it is abandoned.
        d2.abandon()
    }

    func testFireOnFirstResultAfterCreation() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        let d = DeferredList([d1, d2], fireOnFirstResult: true)
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        try d1.takeResult("ok")
        XCTAssertTrue(d.isCalled, "DeferredList should resolve with 1 result if fireOnFirstResult is true")
        var success = false
        d1.then { result in
            success = true
            XCTAssertEqual(result as? String, "ok", "first result not received")
            return result
        }
        XCTAssertTrue(success, "callback wasn't called on resolved DeferredList")
        XCTAssertEqual(d.result as? String, "ok")
        // d2 never fires: it and the list hold each other until it is abandoned.
        d2.abandon()
    }

    func testEmptyList() {
        let d = DeferredList([])
        XCTAssertTrue(d.isCalled, "empty DeferredList didn't immediately resolve")
        XCTAssertEqual((d.result as? [Any?])?.count, 0)
    }

    func testOneResult() throws {
        let d1 = Deferred()
        let d = DeferredList([d1])
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        try d1.takeResult("ok")
        XCTAssertTrue(d.isCalled, "DeferredList should be resolved")
        var success = false
        d.then { result in
            success = true
            XCTAssertEqual((result as? [Any?])?.first as? String, "ok", "expected result not received")
            return result
        }
        XCTAssertTrue(success, "callback wasn't called on resolved DeferredList")
    }

    func testOneError() throws {
        let d1 = Deferred()
        let d = DeferredList([d1])
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        try d1.takeError(Message("ok"))
        XCTAssertTrue(d.isCalled, "DeferredList should be resolved")
        var success = false
        d.then { result in
            success = true
            let results = result as? [Any?]
            XCTAssertEqual(results?.count, 1, "expected one result")
            XCTAssertTrue(results?.first as? Failure != nil, "first result should be Failure")
            XCTAssertEqual(value(results?.first as? Failure), "ok", "expected first result value not received")
            return result
        }
        XCTAssertTrue(success, "callback wasn't called on resolved DeferredList")
    }

    func testOneResultCallbackBeforeResolution() throws {
        let d1 = Deferred()
        let d = DeferredList([d1])
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        var success = false
        d.then { result in
            success = true
            XCTAssertEqual((result as? [Any?])?.first as? String, "ok", "expected result not received")
            return result
        }
        try d1.takeResult("ok")
        XCTAssertTrue(d.isCalled, "DeferredList should be resolved")
        XCTAssertTrue(success, "callback wasn't called on resolved DeferredList")
    }

    func testTwoResults() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        let d = DeferredList([d1, d2])
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        try d1.takeResult("ok1")
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, results incomplete")
        try d2.takeResult("ok2")
        XCTAssertTrue(d.isCalled, "DeferredList should be resolved")
        var success = false
        d.then { result in
            success = true
            let results = result as? [Any?]
            XCTAssertNotNil(results, "callback result should be an array")
            XCTAssertEqual(results?.count, 2, "expected two results")
            XCTAssertEqual(results?[0] as? String, "ok1", "expected first result not received")
            XCTAssertEqual(results?[1] as? String, "ok2", "expected second result not received")
            return result
        }
        XCTAssertTrue(success, "callback wasn't called on resolved DeferredList")
    }

    func testFireOnFirstErrorEmptyList() {
        let d = DeferredList([], fireOnFirstError: true)
        XCTAssertTrue(d.isCalled, "empty DeferredList should immediately resolve, even when fireOnFirstError is true")
    }

    func testFireOnFirstErrorOnCreation() {
        let d1 = Deferred.withError(Message("ok"))
        let d2 = Deferred()
        let d = DeferredList([d1, d2], fireOnFirstError: true)
        XCTAssertTrue(d.isCalled, "DeferredList with errors should immediately resolve if fireOnFirstError is true")
        XCTAssertEqual(value(d.result as? Failure), "ok")
        // d2 never fires: it and the list hold each other until it is abandoned.
        d2.abandon()
    }

    func testFireOnFirstErrorAfterCreation() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        let d = DeferredList([d1, d2], fireOnFirstError: true)
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        try d1.takeError(Message("ok"))
        XCTAssertTrue(d.isCalled, "DeferredList should resolve with 1 error if fireOnFirstError is true")
        var success = false
        d1.fail { failure in
            success = true
            XCTAssertEqual(value(failure), "ok", "error not received")
            return failure
        }
        XCTAssertTrue(success, "errback wasn't called on resolved Deferred")
        success = false
        d.fail { failure in
            success = true
            XCTAssertEqual(value(failure), "ok", "first error not received")
            return failure
        }
        XCTAssertTrue(success, "errback wasn't called on resolved DeferredList")
        // d2 never fires: it and the list hold each other until it is abandoned.
        d2.abandon()
    }

    func testConsumeErrors() throws {
        let d1 = Deferred()
        let d = DeferredList([d1], consumeErrors: true)
        var callbackRan = false
        d1.then({ result in
            callbackRan = true
            XCTAssertNil(result, "callback result should be nil (consumed by DeferredList)")
            return result
        }, fail: { failure in
            XCTFail("errback was called but the error should have been consumed by the DeferredList")
            return failure
        })
        XCTAssertFalse(d.isCalled, "DeferredList shouldn't immediately resolve, no results yet")
        try d1.takeError(Message("ok"))
        XCTAssertTrue(d1.isCalled, "Deferred with error should resolve")
        XCTAssertTrue(d.isCalled, "DeferredList should resolve once its one child has failed")
        XCTAssertTrue(callbackRan)
        var listCallbackRan = false
        d.then { result in
            listCallbackRan = true
            let results = result as? [Any?]
            XCTAssertNotNil(results, "callback result should be an array")
            XCTAssertEqual(results?.count, 1, "expected one result")
            XCTAssertTrue(results?.first as? Failure != nil, "callback result first element should be Failure")
            XCTAssertEqual(value(results?.first as? Failure), "ok", "expected error not received")
            return result
        }
        XCTAssertTrue(listCallbackRan)
    }

    func testCancel() {
        let d1 = Deferred()
        let d2 = Deferred()
        let d = DeferredList([d1, d2])
        var success = false
        d.fail { failure in
            success = true
            XCTAssertTrue(failure.isCancellation, "errback should have been run with the cancellation failure")
            return failure
        }
        XCTAssertFalse(success, "errback run too soon")
        d.cancel()
        XCTAssertTrue(success, "errback should have run")
        XCTAssertFalse(d1.isCalled, "children are not cancelled unless asked")
        // Neither child fires: each holds the list through its link until abandoned.
        d1.abandon()
        d2.abandon()
    }

    func testAbandoningAChildThatNeverFiresFreesItAndTheList() {
        weak var releasedList: DeferredList?
        weak var releasedChild: Deferred?
        do {
            let child = Deferred()
            let d = DeferredList([child])
            releasedList = d
            releasedChild = child
            child.abandon()
        }
        XCTAssertNil(releasedList)
        XCTAssertNil(releasedChild)
    }

    func testCancelDeferredsWhenCancelled() {
        var cancelled1 = false
        var cancelled2 = false
        let d1 = Deferred { d in
            cancelled1 = true
            _ = try? d.takeError(Failure.cancellation())
        }
        let d2 = Deferred { d in
            cancelled2 = true
            _ = try? d.takeError(Failure.cancellation())
        }
        let d = DeferredList([d1, d2])
        d.cancelDeferredsWhenCancelled()
        XCTAssertFalse(cancelled1, "canceller 1 was called prematurely")
        XCTAssertFalse(cancelled2, "canceller 2 was called prematurely")
        var success = false
        var theFailure: Failure?
        d.fail { failure in
            theFailure = failure
            success = true
            return failure
        }
        XCTAssertFalse(success, "errback run too soon")
        d.cancel()
        XCTAssertTrue(success, "errback should have run")
        XCTAssertEqual(theFailure?.isCancellation, true, "errback should have been run with the cancellation failure")
        XCTAssertTrue(cancelled1, "canceller 1 was not called")
        XCTAssertTrue(cancelled2, "canceller 2 was not called")
    }

    // MARK: Beyond the original tests

    func testResultsKeepOrderFailuresAndNils() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        let d3 = Deferred()
        let d = DeferredList([d1, d2, d3])
        try d3.takeResult("third")
        try d2.takeResult(nil)
        try d1.takeError(Message("first"))
        let results = try XCTUnwrap(d.result as? [Any?])
        XCTAssertEqual(results.count, 3)
        XCTAssertEqual(value(results[0] as? Failure), "first")
        XCTAssertNil(results[1] as Any?)
        XCTAssertEqual(results[2] as? String, "third")
        // Without consumeErrors the child keeps failing.
        XCTAssertEqual(value(d1.result as? Failure), "first")
    }

    func testFireOnFirstResultSkipsErrors() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        let d = DeferredList([d1, d2], fireOnFirstResult: true)
        try d1.takeError(Message("bad"))
        XCTAssertFalse(d.isCalled)
        try d2.takeResult("good")
        XCTAssertEqual(d.result as? String, "good")
    }

    func testFireOnFirstResultWithOnlyErrorsFiresWithTheArray() throws {
        let d1 = Deferred()
        let d = DeferredList([d1], fireOnFirstResult: true)
        try d1.takeError(Message("bad"))
        XCTAssertEqual(value((d.result as? [Any?])?.first as? Failure), "bad")
    }

    func testLaterChildrenDoNotRefireTheList() throws {
        let d1 = Deferred()
        let d2 = Deferred()
        let d = DeferredList([d1, d2], fireOnFirstError: true)
        try d1.takeError(Message("first"))
        try d2.takeError(Message("second"))
        XCTAssertEqual(value(d.result as? Failure), "first")
        XCTAssertNil(d.lastMisuse)
    }

    func testChildFiredWithDeferredIsAwaited() throws {
        let inner = Deferred()
        let child = Deferred()
        let d = DeferredList([child])
        try child.takeResult(inner)
        XCTAssertFalse(d.isCalled)
        try inner.takeResult("inner")
        XCTAssertEqual((d.result as? [Any?])?.first as? String, "inner")
    }

    func testListIsUsableAsAChainedDeferred() throws {
        let child = Deferred()
        let outer = Deferred.withResult(nil)
        outer.then { _ in DeferredList([child]) }
        outer.then { result in (result as? [Any?])?.first ?? "missing" }
        XCTAssertTrue(outer.isPaused)
        try child.takeResult("child")
        XCTAssertEqual(outer.result as? String, "child")
    }

    func testCancellingPausedChainCancelsListAndItsChildren() throws {
        var childCancelled = false
        let child = Deferred { _ in childCancelled = true }
        let list = DeferredList([child])
        list.cancelDeferredsWhenCancelled()
        let outer = Deferred.withResult(nil)
        outer.then { _ in list }
        outer.cancel()
        XCTAssertTrue(childCancelled)
        XCTAssertEqual((outer.result as? Failure)?.isCancellation, true)
    }

    func testSettledListAndChildrenAreReleased() throws {
        weak var weakList: DeferredList?
        weak var weakChild: Deferred?
        do {
            let child = Deferred()
            let list = DeferredList([child])
            try child.takeResult(1)
            weakList = list
            weakChild = child
        }
        XCTAssertNil(weakList)
        XCTAssertNil(weakChild)
    }

    func testListOfTenThousandChildren() {
        let children = (0..<10_000).map { _ in Deferred() }
        let list = DeferredList(children)
        var results: [Any?] = []
        onSmallStack {
            for (index, child) in children.enumerated() {
                _ = try? child.takeResult(index)
            }
            results = list.result as? [Any?] ?? []
        }
        XCTAssertEqual(results.count, 10_000)
        XCTAssertEqual(results.last as? Int, 9_999)
    }
}
