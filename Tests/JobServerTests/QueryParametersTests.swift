import JobCore
import XCTest

@testable import JobServer

final class QueryParametersTests: XCTestCase {
    private func items(_ pairs: [(String, String)]) -> QueryParameters.Items {
        pairs.map { (name: $0.0, value: $0.1) }
    }

    func testWaitAcceptsZeroToSixtySeconds() throws {
        XCTAssertEqual(try QueryParameters.jobWait(items([])), .init(waitSeconds: nil, sinceVersion: nil))
        XCTAssertEqual(try QueryParameters.jobWait(items([("wait", "0")])).waitSeconds, 0)
        XCTAssertEqual(try QueryParameters.jobWait(items([("wait", "60")])).waitSeconds, 60)
        XCTAssertEqual(try QueryParameters.jobWait(items([("wait", "5"), ("since", "12")])),
                       .init(waitSeconds: 5, sinceVersion: 12))
    }

    func testWaitOutOfRangeOrMalformedIsRefusedNotClamped() {
        for bad in ["61", "-1", "", "1.5", "5s", " 5", "+5", "1e1", "99999999999999999999999"] {
            XCTAssertThrowsError(try QueryParameters.jobWait(items([("wait", bad)])), "wait=\(bad)")
        }
        XCTAssertThrowsError(try QueryParameters.jobWait(items([("wait", "1"), ("wait", "2")])))
    }

    func testSinceMustBeNumeric() {
        XCTAssertEqual(try QueryParameters.jobWait(items([("since", "9223372036854775807")])).sinceVersion, Int64.max)
        for bad in ["abc", "", "-3", "1.0", "0x10", "9223372036854775808"] {
            XCTAssertThrowsError(try QueryParameters.jobWait(items([("since", bad)])), "since=\(bad)")
        }
    }

    func testListDefaultsAndBounds() throws {
        XCTAssertEqual(try QueryParameters.jobList(items([])), .init(state: nil, limit: 50, cursor: nil))
        XCTAssertEqual(try QueryParameters.jobList(items([("limit", "1")])).limit, 1)
        XCTAssertEqual(try QueryParameters.jobList(items([("limit", "500")])).limit, 500)
        XCTAssertEqual(
            try QueryParameters.jobList(items([("state", "running"), ("cursor", "abc")])),
            .init(state: .running, limit: 50, cursor: "abc"))
        for bad in ["0", "501", "-1", "ten", ""] {
            XCTAssertThrowsError(try QueryParameters.jobList(items([("limit", bad)])), "limit=\(bad)")
        }
    }

    func testEveryKnownStateIsAcceptedAndOthersRefused() throws {
        for state in NodeState.allCases {
            XCTAssertEqual(try QueryParameters.jobList(items([("state", state.rawValue)])).state, state)
        }
        for bad in ["done", "RUNNING", "", "succeeded,failed"] {
            XCTAssertThrowsError(try QueryParameters.jobList(items([("state", bad)])), "state=\(bad)")
        }
        XCTAssertThrowsError(try QueryParameters.jobList(items([("cursor", "")])))
        XCTAssertThrowsError(try QueryParameters.jobList(items([("cursor", String(repeating: "c", count: 201))])))
    }

    func testIncludeOnlyKnowsResult() throws {
        XCTAssertFalse(try QueryParameters.includeResult(items([])))
        XCTAssertTrue(try QueryParameters.includeResult(items([("include", "result")])))
        XCTAssertThrowsError(try QueryParameters.includeResult(items([("include", "results")])))
        XCTAssertThrowsError(try QueryParameters.includeResult(items([("include", "")])))
    }

    func testUnknownParametersAreIgnored() throws {
        XCTAssertEqual(try QueryParameters.jobList(items([("_", "123")])).limit, 50)
    }
}
