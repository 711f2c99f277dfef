import XCTest

@testable import JobCore

extension XCTestCase {
    /// The job of `body` (a submission as JSON text); fails the test where it is refused.
    func acceptedSpec(_ body: String, file: StaticString = #filePath, line: UInt = #line) throws -> JobSpec {
        do {
            return try JobSpec.parse(try JSONValue.parse(body))
        } catch let error as ValidationError {
            XCTFail("refused \(body): \(error)", file: file, line: line)
            throw error
        }
    }

    /// The issues `body` (a submission as JSON text) is refused with; fails the test where it is accepted, or
    /// refused without an issue.
    func refusalIssues(
        _ body: String, limits: GraphLimits = GraphLimits(), file: StaticString = #filePath, line: UInt = #line
    ) -> [ValidationIssue] {
        do {
            _ = try JobSpec.parse(try JSONValue.parse(body), limits: limits)
            XCTFail("accepted: \(body)", file: file, line: line)
        } catch let error as ValidationError {
            XCTAssertFalse(error.issues.isEmpty, "refused without an issue: \(body)", file: file, line: line)
            return error.issues
        } catch {
            XCTFail("unexpected error \(error) for \(body)", file: file, line: line)
        }
        return []
    }
}
