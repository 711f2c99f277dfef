import Foundation
import JobCore
import TestSupport
import XCTest

/// Cancellation reaches transfers in flight at once.
final class FetcherCancelTests: FetcherTestCase {
    private func waitForActive(_ n: Int) throws {
        try upstream.waitForStats("\(n) requests in flight") { $0["active"]?.intValue == n }
    }

    func testCancelAbortsTransferInFlightAndClosesItsConnection() throws {
        let box = OutcomeBox()
        let handle = fetcher.start(FetchRequest(url: upstream.url("/hang"))) { box.set($0) }
        try waitForActive(1)
        XCTAssertEqual(fetcher.inFlight, 1)
        handle.cancel()
        let outcome = try XCTUnwrap(box.wait(seconds: 2))
        XCTAssertEqual(outcome.error?.kind, .cancelled)
        XCTAssertEqual(outcome.attempts, 1)
        let stats = try upstream.waitForStats("the disconnect") { $0["disconnects"]?.arrayValue?.isEmpty == false }
        let record = try XCTUnwrap(stats["disconnects"]?.arrayValue?.first)
        XCTAssertEqual(record["path"], "/hang", "a request that never ends by itself was closed")
        XCTAssertEqual(fetcher.inFlight, 0)
    }

    func testCancelIsIdempotentAndCompletesExactlyOnce() throws {
        let box = OutcomeBox()
        let handle = fetcher.start(FetchRequest(url: upstream.url("/delay/5000"))) { box.set($0) }
        handle.cancel()
        handle.cancel()
        XCTAssertEqual(box.wait(seconds: 2)?.error?.kind, .cancelled)
        handle.cancel()
        // The fetcher handles commands in order: once a later fetch has completed, a second completion of the first
        // would have come.
        XCTAssertEqual(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json")))?.response?.status, 200)
        XCTAssertEqual(box.completionCount, 1)

        let done = OutcomeBox()
        let finished = fetcher.start(FetchRequest(url: upstream.url("/json"))) { done.set($0) }
        XCTAssertEqual(done.wait(seconds: 5)?.response?.status, 200)
        finished.cancel()
        XCTAssertEqual(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json")))?.response?.status, 200)
        XCTAssertEqual(done.completionCount, 1)
    }

    func testManyCancellationsFromOtherThreadsAllComplete() throws {
        let box = OutcomeBox()
        let handles = (0..<60).map { i in
            fetcher.start(FetchRequest(url: upstream.url(i % 2 == 0 ? "/hang" : "/delay/5000"))) { box.set($0) }
        }
        try waitForActive(16)  // the default per-host limit: the rest wait in libcurl's queue
        DispatchQueue.concurrentPerform(iterations: handles.count) { handles[$0].cancel() }
        // Half of them never end by themselves and the rest only after 5 s: every outcome is a cancel's.
        let outcomes = try XCTUnwrap(box.all(seconds: 4, count: 60))
        XCTAssertTrue(outcomes.allSatisfy { $0.error?.kind == .cancelled })
        XCTAssertEqual(fetcher.inFlight, 0)
        // The fetcher still works afterwards.
        XCTAssertEqual(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json")))?.response?.status, 200)
    }

    func testStartsFromManyThreadsAllComplete() throws {
        let box = OutcomeBox()
        let fetcher: Fetcher = self.fetcher, upstream: Upstream = self.upstream
        DispatchQueue.concurrentPerform(iterations: 200) { i in
            fetcher.start(FetchRequest(url: upstream.url("/json?size=\(10 + i)"))) { box.set($0) }
        }
        let outcomes = try XCTUnwrap(box.all(seconds: 30, count: 200))
        XCTAssertEqual(Set(outcomes.compactMap { $0.response?.bytes }), Set(10..<210))
        XCTAssertEqual(fetcher.stats.outcomes["succeeded"], 200)
    }

    func testShutdownFromACompletionOnTheFetcherThreadDoesNotDeadlock() throws {
        let box = OutcomeBox()
        let fetcher = try XCTUnwrap(self.fetcher)
        fetcher.start(FetchRequest(url: upstream.url("/json"))) { outcome in
            fetcher.shutdown()
            box.set(outcome)
        }
        XCTAssertEqual(box.wait(seconds: 5)?.response?.status, 200)
        let late = OutcomeBox()
        fetcher.start(FetchRequest(url: upstream.url("/json"))) { late.set($0) }
        XCTAssertEqual(late.wait(seconds: 2)?.error?.kind, .cancelled)
    }
}
