import HTTPServer
import JobCore
import XCTest

@testable import JobServer

final class ExchangeTests: XCTestCase {
    func testOnlyTheFirstResponseIsDeliveredAndItCarriesTheRequestId() {
        let box = AnswerBox()
        let request = APIRequest(method: "GET", path: "/x", headers: HTTPHeaders([("X-Request-Id", "abc")]))
        let exchange = Exchange(
            request: request, logger: .disabled,
            deliver: { box.put(Answer(status: $0.status, headers: $0.headers, body: $0.body)) },
            registerOnClose: { _ in })
        DispatchQueue.concurrentPerform(iterations: 8) { i in exchange.send(HTTPResponse(status: 200 + i)) }
        XCTAssertNotNil(box.wait(1))
        XCTAssertEqual(box.count, 1)
        XCTAssertEqual(box.first?.headers["X-Request-Id"], "abc")
    }

    func testGeneratedRequestIdsAre32HexDigitsAndDiffer() {
        let a = Exchange.requestID(from: HTTPHeaders())
        let b = Exchange.requestID(from: HTTPHeaders())
        XCTAssertEqual(a.count, 32)
        XCTAssertTrue(a.allSatisfy(\.isHexDigit))
        XCTAssertNotEqual(a, b)
        XCTAssertEqual(Exchange.requestID(from: HTTPHeaders([("x-request-id", "A_b.c:d/e+f=g@h-1")])), "A_b.c:d/e+f=g@h-1")
        XCTAssertNotEqual(Exchange.requestID(from: HTTPHeaders([("X-Request-Id", "")])), "")
        XCTAssertEqual(Exchange.requestID(from: HTTPHeaders([("X-Request-Id", "é")])).count, 32)
        XCTAssertEqual(Exchange.requestID(from: HTTPHeaders([("X-Request-Id", "a\"b{}~!")])), "a\"b{}~!")
        XCTAssertEqual(Exchange.requestID(from: HTTPHeaders([("X-Request-Id", "a b")])).count, 32)
        XCTAssertEqual(Exchange.requestID(from: HTTPHeaders([("X-Request-Id", "a\u{7F}")])).count, 32)
    }

    func testMediaTypeOfASubmission() {
        XCTAssertNil(App.mediaTypeProblem("application/json"))
        XCTAssertNil(App.mediaTypeProblem("Application/JSON"))
        XCTAssertNil(App.mediaTypeProblem("application/json; charset=utf-8"))
        XCTAssertNil(App.mediaTypeProblem("application/json;charset=\"UTF-8\""))
        XCTAssertNotNil(App.mediaTypeProblem(nil))
        XCTAssertNotNil(App.mediaTypeProblem("application/jsonx"))
        XCTAssertNotNil(App.mediaTypeProblem("text/json"))
        XCTAssertNotNil(App.mediaTypeProblem("application/x-www-form-urlencoded"))
        XCTAssertNotNil(App.mediaTypeProblem("application/json; charset=utf-16"))
        XCTAssertNotNil(App.mediaTypeProblem("text/plain"))
    }

    func testOnlyTheEnginesBadCursorErrorIsABadCursor() {
        struct Other: Error, CustomStringConvertible { var description: String }
        XCTAssertTrue(App.isBadCursor(EngineError.badCursor("invalid cursor")))
        XCTAssertFalse(App.isBadCursor(EngineError.storage("cursor of doom")))
        XCTAssertFalse(App.isBadCursor(Other(description: "invalid cursor")))
    }
}
