import XCTest

@testable import JobServer

final class BearerAuthTests: XCTestCase {
    func testOnlyTheExactBearerTokenIsAllowed() {
        let auth = BearerAuth(token: "s3cret-token")
        XCTAssertTrue(auth.allows("Bearer s3cret-token"))
        XCTAssertTrue(auth.allows("bearer s3cret-token"))
        XCTAssertFalse(auth.allows(nil))
        XCTAssertFalse(auth.allows(""))
        XCTAssertFalse(auth.allows("Bearer"))
        XCTAssertFalse(auth.allows("Bearer "))
        XCTAssertFalse(auth.allows("Bearer s3cret-toke"))
        XCTAssertFalse(auth.allows("Bearer s3cret-token2"))
        XCTAssertFalse(auth.allows("Bearer S3cret-token"))
        XCTAssertFalse(auth.allows("Basic s3cret-token"))
        XCTAssertFalse(auth.allows("s3cret-token"))
    }

    func testConstantTimeEqualComparesWholeArrays() {
        XCTAssertTrue(BearerAuth.constantTimeEqual([], []))
        XCTAssertTrue(BearerAuth.constantTimeEqual([1, 2, 3], [1, 2, 3]))
        XCTAssertFalse(BearerAuth.constantTimeEqual([1, 2, 3], [1, 2, 4]))
        XCTAssertFalse(BearerAuth.constantTimeEqual([1, 2, 3], [1, 2]))
        XCTAssertFalse(BearerAuth.constantTimeEqual([1, 2], [1, 2, 0]))
        XCTAssertFalse(BearerAuth.constantTimeEqual([], [0]))
        // Lengths that differ by a multiple of 256 must not look equal.
        XCTAssertFalse(BearerAuth.constantTimeEqual([UInt8](repeating: 0, count: 256), []))
    }
}
