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
        XCTAssertEqual(Exchange.requestID(from: HTTPHeaders([("X-Request-Id", "a\"b")])).count, 32)
    }

    func testMediaTypeOfASubmission() {
        XCTAssertNil(App.mediaTypeProblem("application/json", hasBody: true))
        XCTAssertNil(App.mediaTypeProblem("Application/JSON", hasBody: true))
        XCTAssertNil(App.mediaTypeProblem("application/json; charset=utf-8", hasBody: true))
        XCTAssertNil(App.mediaTypeProblem("application/json;charset=\"UTF-8\"", hasBody: true))
        XCTAssertNil(App.mediaTypeProblem(nil, hasBody: false))
        XCTAssertNotNil(App.mediaTypeProblem(nil, hasBody: true))
        XCTAssertNotNil(App.mediaTypeProblem("application/jsonx", hasBody: true))
        XCTAssertNotNil(App.mediaTypeProblem("text/json", hasBody: true))
        XCTAssertNotNil(App.mediaTypeProblem("application/x-www-form-urlencoded", hasBody: true))
        XCTAssertNotNil(App.mediaTypeProblem("application/json; charset=utf-16", hasBody: true))
        XCTAssertNotNil(App.mediaTypeProblem("text/plain", hasBody: false))
    }

    func testBadCursorIsRecognisedByItsMessage() {
        struct Refusal: Error, CustomStringConvertible { var description: String }
        XCTAssertTrue(App.isBadCursor(Refusal(description: "invalid cursor \"x\"")))
        XCTAssertFalse(App.isBadCursor(Refusal(description: "disk I/O error")))
    }
}
