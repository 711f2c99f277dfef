import Foundation
import JobCore
import TestSupport
import XCTest

/// Retries: which failures, which methods, backoff and Retry-After.
final class FetcherRetryTests: FetcherTestCase {
    private func counter(_ key: String) throws -> Int? {
        try upstream.stats()["counters"]?[key]?.intValue
    }

    func testTwoServiceUnavailableAnswersThenSuccessTakeThreeAttempts() throws {
        let attempts = AttemptLog()
        let request = FetchRequest(url: upstream.url("/count/a?fail=2"), retries: 3, retryBackoffMs: 10)
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, request, onAttempt: { attempts.append($0) }))
        XCTAssertEqual(outcome.response?.status, 200)
        XCTAssertEqual(outcome.response?.body["count"], 3)
        XCTAssertEqual(outcome.attempts, 3)
        XCTAssertEqual(attempts.values, [1, 2, 3])
        XCTAssertEqual(try counter("a"), 3)
        XCTAssertEqual(fetcher.stats.attempts, 3)
    }

    func testExhaustedRetriesFailWithTheLastStatusAndResponse() throws {
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/count/b?fail=9"), retries: 2, retryBackoffMs: 5)))
        XCTAssertEqual(outcome.error?.kind, .httpStatus)
        XCTAssertEqual(outcome.error?.status, 503)
        XCTAssertEqual(outcome.attempts, 3)
        XCTAssertEqual(outcome.lastResponse?.body["count"], 3)
        XCTAssertEqual(try counter("b"), 3)
    }

    func testPostIsNotRetriedUnlessIdempotent() throws {
        let post = FetchRequest(url: upstream.url("/count/post?fail=1"), method: "POST", retries: 3, retryBackoffMs: 5)
        let once = try XCTUnwrap(fetchAndWait(fetcher, post))
        XCTAssertEqual(once.error?.status, 503)
        XCTAssertEqual(once.attempts, 1)
        XCTAssertEqual(try counter("post"), 1)

        let safe = FetchRequest(url: upstream.url("/count/safe?fail=1"), method: "POST", retries: 3, retryBackoffMs: 5, idempotent: true)
        let retried = try XCTUnwrap(fetchAndWait(fetcher, safe))
        XCTAssertEqual(retried.response?.status, 200)
        XCTAssertEqual(retried.attempts, 2)
    }

    func testTooManyRequestsIsRetriedAndNotFoundIsNot() throws {
        let throttled = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/count/t?fail=1&fail_status=429"), retries: 1, retryBackoffMs: 5)))
        XCTAssertEqual(throttled.response?.status, 200)
        XCTAssertEqual(throttled.attempts, 2)
        let missing = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/count/m?fail=1&fail_status=404"), retries: 3, retryBackoffMs: 5)))
        XCTAssertEqual(missing.error?.status, 404)
        XCTAssertEqual(missing.attempts, 1)
    }

    func testRetryAfterIsHonoured() throws {
        let started = Date()
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/count/ra?fail=1&retry_after=1"), retries: 1, retryBackoffMs: 1)))
        XCTAssertEqual(outcome.response?.status, 200)
        XCTAssertEqual(outcome.attempts, 2)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.95)
        XCTAssertGreaterThanOrEqual(outcome.response?.elapsedMs ?? 0, 950)
    }

    func testBackoffDoublesBetweenAttempts() throws {
        let started = Date()
        // 100 + 200 ms (±20%) of backoff before the third attempt.
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/count/d?fail=2"), retries: 2, retryBackoffMs: 100)))
        XCTAssertEqual(outcome.attempts, 3)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.24)
    }

    func testConnectErrorsAndTimeoutsAreRetried() throws {
        let reset = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/reset"), retries: 2, retryBackoffMs: 5)))
        XCTAssertEqual(reset.error?.kind, .connect)
        XCTAssertEqual(reset.attempts, 3)
        let slow = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/count/slow?delay_ms=1000"), retries: 1, retryBackoffMs: 5), timeoutMs: 150))
        XCTAssertEqual(slow.error?.kind, .timeout)
        XCTAssertEqual(slow.attempts, 2)
        let dns = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: "http://nonexistent.invalid/", retries: 2, retryBackoffMs: 5)))
        XCTAssertEqual(dns.error?.kind, .dns)
        XCTAssertEqual(dns.attempts, 1)
    }

    func testCancelDuringBackoffCompletesAtOnce() throws {
        let box = OutcomeBox()
        let handle = fetcher.start(FetchRequest(url: upstream.url("/count/c?fail=5"), retries: 5, retryBackoffMs: 10_000)) { box.set($0) }
        guard fetcher.waitForStats(milliseconds: 5000, until: { $0.backingOff == 1 }) else {
            throw UpstreamError("the first attempt never went into its backoff")
        }
        XCTAssertEqual(try counter("c"), 1)
        handle.cancel()
        // The backoff is 10 s: an outcome well before that is the cancel's.
        let outcome = try XCTUnwrap(box.wait(seconds: 5))
        XCTAssertEqual(outcome.error?.kind, .cancelled)
        XCTAssertEqual(outcome.attempts, 1)
        XCTAssertEqual(outcome.lastResponse?.status, 503)
        XCTAssertEqual(fetcher.inFlight, 0)
    }
}

/// Attempt numbers reported on the fetcher's thread.
final class AttemptLog: @unchecked Sendable {
    // @unchecked: `list` is read and written only with `lock` held.
    private let lock = NSLock()
    private var list: [Int] = []
    func append(_ n: Int) { lock.lock(); list.append(n); lock.unlock() }
    var values: [Int] { lock.lock(); defer { lock.unlock() }; return list }
}
