import Foundation
import JobCore
import TestSupport
import XCTest

/// A job's `ByteBudget` as the fetcher counts it: body bytes as they arrive, over every fetch and attempt.
final class FetcherBudgetTests: FetcherTestCase {
    private func fetch(_ path: String, budget: ByteBudget, retries: Int = 0) throws -> FetchOutcome {
        let box = OutcomeBox()
        fetcher.start(FetchRequest(url: upstream.url(path), retries: retries, retryBackoffMs: 1), budget: budget) {
            box.set($0)
        }
        return try XCTUnwrap(box.wait(seconds: 20), "fetch of \(path) did not complete")
    }

    func testTheFetchThatCrossesTheBudgetFailsTooLargeNamingItAndTheFlag() throws {
        for suffix in ["", "?chunked=1"] {
            let budget = ByteBudget(limit: 1000)
            XCTAssertEqual(try fetch("/bytes/600" + suffix, budget: budget).response?.bytes, 600, suffix)
            let over = try fetch("/bytes/401" + suffix, budget: budget)
            XCTAssertEqual(over.error?.kind, .tooLarge, suffix)
            let message = over.error?.message ?? ""
            XCTAssertTrue(message.contains("budget of 1000 bytes") && message.contains("--max-job-bytes"), message)
            XCTAssertTrue(over.crossedBudget, suffix)
            // What the refused fetch received before it crossed is given back; what fits still fits.
            XCTAssertEqual(budget.usedBytes, 600, suffix)
            let left = budget.remaining
            XCTAssertEqual(try fetch("/bytes/\(left)" + suffix, budget: budget).response?.bytes, left, suffix)
            XCTAssertEqual(budget.usedBytes, 1000, suffix)
        }
    }

    func testAnotherFetchsOwnLimitIsNotTakenForTheBudget() throws {
        let budget = ByteBudget(limit: 1 << 20)
        let box = OutcomeBox()
        fetcher.start(FetchRequest(url: upstream.url("/bytes/1001"), maxBytes: 1000), budget: budget) { box.set($0) }
        let outcome = try XCTUnwrap(box.wait(seconds: 20))
        XCTAssertEqual(outcome.error?.kind, .tooLarge)
        XCTAssertFalse(outcome.crossedBudget, "the fetch's own max_bytes")
    }

    func testARetryCountsItsAnswerAndGivesBackTheOneItReplaces() throws {
        let budget = ByteBudget(limit: 1 << 20)
        let outcome = try fetch("/count/budget-retry?fail=1", budget: budget, retries: 1)
        let response = try XCTUnwrap(outcome.response)
        XCTAssertEqual(outcome.attempts, 2)
        XCTAssertGreaterThan(response.bytes, 0)
        XCTAssertEqual(budget.usedBytes, response.bytes, "only the answer kept is held")
        // An answer that fails after its retries is kept (its body is stored), so it stays counted.
        let failed = try fetch("/status/503", budget: budget, retries: 1)
        XCTAssertEqual(failed.error?.kind, .httpStatus)
        XCTAssertEqual(budget.usedBytes, response.bytes + (failed.lastResponse?.bytes ?? -1))
    }

    func testAFetchThatFailsMidBodyGivesBackWhatItReceived() throws {
        // 8 MiB of a 12 MiB chunked body arrive, in many chunks, before the budget stops it.
        let budget = ByteBudget(limit: 8 << 20)
        let box = OutcomeBox()
        fetcher.start(FetchRequest(url: upstream.url("/bytes/\(12 << 20)?chunked=1"), maxBytes: 16 << 20), budget: budget) {
            box.set($0)
        }
        let outcome = try XCTUnwrap(box.wait(seconds: 20))
        XCTAssertEqual(outcome.error?.kind, .tooLarge)
        XCTAssertTrue(outcome.error?.message.contains("budget of \(8 << 20) bytes") == true, outcome.error?.message ?? "")
        XCTAssertTrue(outcome.crossedBudget)
        XCTAssertEqual(budget.usedBytes, 0)
        // A transfer error: nothing kept, nothing held.
        XCTAssertEqual(try fetch("/close", budget: budget).error?.kind, .connect)
        XCTAssertEqual(budget.usedBytes, 0)
    }

    func testAStartingCountIsHeldToo() throws {
        let budget = ByteBudget(limit: 1000, used: 900)
        XCTAssertEqual(budget.remaining, 100)
        XCTAssertEqual(try fetch("/bytes/101", budget: budget).error?.kind, .tooLarge)
        XCTAssertEqual(try fetch("/bytes/100", budget: budget).response?.bytes, 100)
        XCTAssertEqual(budget.remaining, 0)
    }

    func testJobsDrawOnTheServersBudgetAndGiveBackWhatTheyHeldWhenTheyEnd() throws {
        let server = ByteBudget(limit: 1000, scope: .server)
        var first: ByteBudget? = ByteBudget(limit: 1 << 20, shared: server)
        let second = ByteBudget(limit: 1 << 20, shared: server)
        XCTAssertEqual(try fetch("/bytes/600", budget: try XCTUnwrap(first)).response?.bytes, 600)
        XCTAssertEqual(server.usedBytes, 600)
        for suffix in ["", "?chunked=1"] {
            // Refused by the server's budget, not the job's: named so, and retried when the fetch asks.
            let over = try fetch("/bytes/401" + suffix, budget: second, retries: 2)
            XCTAssertEqual(over.error?.kind, .tooLarge, suffix)
            let message = over.error?.message ?? ""
            XCTAssertTrue(message.contains("the server's 1000 bytes") && message.contains("--max-response-memory"), message)
            XCTAssertTrue(over.crossedBudget, suffix)
            XCTAssertEqual(over.attempts, 3, suffix)
            XCTAssertEqual(second.usedBytes, 0, suffix)
            XCTAssertEqual(server.usedBytes, 600, suffix)
        }
        // The first job leaves memory: what it held goes back at once (a finished transfer lets go of its budget
        // before it answers), and the second's fetch fits.
        first = nil
        XCTAssertEqual(server.usedBytes, 0)
        XCTAssertEqual(try fetch("/bytes/401", budget: second).response?.bytes, 401)
        XCTAssertEqual(server.usedBytes, 401)
        // A job's own budget is still its own: refused there, the fetch is not retried.
        let small = ByteBudget(limit: 100, shared: server)
        let own = try fetch("/bytes/101", budget: small, retries: 2)
        XCTAssertTrue(own.error?.message.contains("--max-job-bytes") == true, own.error?.message ?? "")
        XCTAssertEqual(own.attempts, 1)
    }
}
