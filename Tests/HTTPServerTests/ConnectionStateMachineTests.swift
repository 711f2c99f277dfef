import XCTest
@testable import HTTPServer

/// The connection lifecycle without sockets: events in, actions out, the clock a number.
final class ConnectionStateMachineTests: XCTestCase {
    private typealias Machine = ConnectionStateMachine
    private let timeouts = Machine.Timeouts(header: 300, request: 1000, idle: 5000, linger: 2000, lingerAfterTimeout: 500)

    private static let idle = Machine.Buffers(parserIdle: true, readingBody: false, hasOutput: false, bufferedInput: 0)
    private static let head = Machine.Buffers(parserIdle: false, readingBody: false, hasOutput: false, bufferedInput: 0)
    private static let body = Machine.Buffers(parserIdle: false, readingBody: true, hasOutput: false, bufferedInput: 0)
    private static let writing = Machine.Buffers(parserIdle: true, readingBody: false, hasOutput: true, bufferedInput: 0)

    private func machine(at now: UInt64 = 0) -> Machine {
        Machine(timeouts: timeouts, now: now)
    }

    func testAConnectionThatSendsNothingClosesSilentlyAfterTheHeaderTimeout() {
        var m = machine()
        XCTAssertEqual(m.event(.tick(now: 299, Self.idle)), .none)
        XCTAssertEqual(m.event(.tick(now: 300, Self.idle)), .close)
        XCTAssertTrue(m.isClosed)
    }

    func testAPartialHeadIsAnswered408AtTheHeaderTimeoutThenLingersBriefly() {
        var m = machine()
        _ = m.event(.requestBegan(now: 100))
        _ = m.event(.bytesReceived(now: 100))
        XCTAssertEqual(m.event(.tick(now: 399, Self.head)), .none)
        XCTAssertEqual(m.event(.tick(now: 400, Self.head)), .answerTimeout(message: "request head not received within 300 ms"))
        XCTAssertEqual(m.event(.errorQueued), .none)
        XCTAssertFalse(m.acceptsInput)
        XCTAssertFalse(m.mayParse)
        XCTAssertEqual(m.event(.outputDrained(now: 410)), .startLingering)
        XCTAssertTrue(m.isLingering)
        XCTAssertTrue(m.wantsRead(Self.idle), "a lingering connection is drained")
        XCTAssertEqual(m.event(.tick(now: 909, Self.idle)), .none)
        XCTAssertEqual(m.event(.tick(now: 910, Self.idle)), .close, "500 ms after a timeout, not the usual 2 s")
    }

    func testABodyTricklingInTimesOutAtTheRequestLimitThoughNeverIdle() {
        var m = machine()
        _ = m.event(.requestBegan(now: 0))
        var now: UInt64 = 0
        var action = Machine.Action.none
        // One byte every 100 ms: the 300 ms gap limit never fires, the 1 s total does.
        while now < 2000 && action == .none {
            now += 100
            _ = m.event(.bytesReceived(now: now))
            action = m.event(.tick(now: now, Self.body))
        }
        XCTAssertEqual(now, 1000)
        XCTAssertEqual(action, .answerTimeout(message: "request not received within 1 s"))
    }

    func testABodyThatStallsTimesOutAtTheGapLimit() {
        var m = machine()
        _ = m.event(.requestBegan(now: 0))
        _ = m.event(.bytesReceived(now: 50))
        XCTAssertEqual(m.event(.tick(now: 349, Self.body)), .none)
        XCTAssertEqual(m.event(.tick(now: 350, Self.body)), .answerTimeout(message: "no request body bytes for 300 ms"))
    }

    func testNoTimeLimitWhileAHandlerWorksThenTheIdleLimitBetweenRequests() {
        var m = machine()
        _ = m.event(.requestBegan(now: 0))
        _ = m.event(.requestDispatched)
        XCTAssertNil(m.deadline(Self.idle))
        XCTAssertEqual(m.event(.tick(now: 1_000_000, Self.idle)), .none)
        XCTAssertEqual(m.event(.answerQueued(keepAlive: true)), .none)
        _ = m.event(.outputWritten(now: 1_000_010))
        XCTAssertEqual(m.event(.outputDrained(now: 1_000_010)), .none)
        XCTAssertEqual(m.deadline(Self.idle), 1_005_010)
        XCTAssertEqual(m.event(.tick(now: 1_005_010, Self.idle)), .close, "an idle keep-alive connection closes silently")
    }

    func testAClientThatDoesNotReadIsClosedAfterTheIdleLimitWithoutAnAnswer() {
        var m = machine()
        _ = m.event(.requestDispatched)
        _ = m.event(.answerQueued(keepAlive: true))
        _ = m.event(.outputWritten(now: 10))
        XCTAssertFalse(m.wantsRead(Self.writing), "nothing is read while output waits")
        XCTAssertEqual(m.event(.tick(now: 5009, Self.writing)), .none)
        XCTAssertEqual(m.event(.tick(now: 5010, Self.writing)), .close)
    }

    func testParsingStopsAtSixteenUnwrittenAnswersAndResumesOnceWritten() {
        var m = machine()
        for _ in 0..<Machine.maxAnswersInFlight {
            XCTAssertTrue(m.mayParse)
            _ = m.event(.requestDispatched)
            XCTAssertFalse(m.mayParse, "later requests wait behind a pending one")
            _ = m.event(.answerQueued(keepAlive: true))
        }
        XCTAssertFalse(m.mayParse)
        _ = m.event(.outputWritten(now: 5))
        XCTAssertFalse(m.mayParse, "a partial write is not enough")
        _ = m.event(.outputDrained(now: 6))
        XCTAssertTrue(m.mayParse)
    }

    func testParsingWaitsOnceAMebibyteOfAnswersIsUnwrittenAndResumesOnceWritten() {
        var m = machine()
        let small = Machine.maxAnswerBytesInFlight / 4
        for _ in 0..<3 {
            _ = m.event(.requestDispatched)
            _ = m.event(.answerQueued(keepAlive: true, bytes: small))
            XCTAssertTrue(m.mayParse, "three quarters of the bound are unwritten")
        }
        _ = m.event(.requestDispatched)
        _ = m.event(.answerQueued(keepAlive: true, bytes: small))
        XCTAssertFalse(m.mayParse, "four answers make the bound: the fifth request waits")
        _ = m.event(.outputWritten(now: 5))
        XCTAssertFalse(m.mayParse, "a partial write is not enough")
        _ = m.event(.outputDrained(now: 6))
        XCTAssertTrue(m.mayParse)

        // One answer larger than the bound is the only one made until it is written out.
        _ = m.event(.requestDispatched)
        _ = m.event(.answerQueued(keepAlive: true, bytes: 60 << 20))
        XCTAssertFalse(m.mayParse)
        _ = m.event(.outputDrained(now: 7))
        XCTAssertTrue(m.mayParse)
    }

    func testReadingStopsWhileOutputWaitsOrTheBacklogIsFull() {
        let m = machine()
        XCTAssertTrue(m.wantsRead(Self.idle))
        XCTAssertFalse(m.wantsRead(Self.writing))
        let backlog = Machine.Buffers(parserIdle: true, readingBody: false, hasOutput: false,
                                      bufferedInput: Machine.maxBacklog)
        XCTAssertFalse(m.wantsRead(backlog))
    }

    func testHalfClosedClientIsAnsweredThenClosed() {
        var m = machine()
        _ = m.event(.requestDispatched)
        XCTAssertEqual(m.event(.peerClosed(watched: false)), .none)
        XCTAssertFalse(m.wantsRead(Self.idle), "after FIN EPOLLIN would stay ready forever")
        XCTAssertEqual(m.event(.settled(Self.idle)), .none, "the pending request is still answered")
        _ = m.event(.answerQueued(keepAlive: true))
        XCTAssertEqual(m.event(.settled(Self.writing)), .none)
        XCTAssertEqual(m.event(.outputDrained(now: 10)), .none)
        XCTAssertEqual(m.event(.settled(Self.idle)), .close)
    }

    func testHalfClosedClientStillGetsItsPipelinedRequestsParsed() {
        var m = machine()
        _ = m.event(.peerClosed(watched: false))
        XCTAssertTrue(m.mayParse)
        XCTAssertFalse(m.acceptsInput, "nothing can arrive after the FIN")
        XCTAssertTrue(m.keepsInput, "what arrived before it is still parsed")
        _ = m.event(.requestDispatched)
        _ = m.event(.answerQueued(keepAlive: false))
        XCTAssertEqual(m.event(.outputDrained(now: 1)), .close, "no linger: the client already finished sending")
    }

    func testAWatchingHandlerGetsOneProbeWhetherTheFINComesBeforeOrAfterItAsks() {
        var before = machine()
        _ = before.event(.requestDispatched)
        XCTAssertEqual(before.event(.peerClosed(watched: true)), .probe)
        XCTAssertEqual(before.event(.closeWatchRequested(watched: true)), .none, "only one probe per request")

        var after = machine()
        _ = after.event(.requestDispatched)
        XCTAssertEqual(after.event(.closeWatchRequested(watched: true)), .none, "no FIN yet")
        XCTAssertEqual(after.event(.peerClosed(watched: false)), .none)
        XCTAssertEqual(after.event(.closeWatchRequested(watched: true)), .probe)

        var idle = machine()
        XCTAssertEqual(idle.event(.peerClosed(watched: true)), .none, "nothing pending: nothing to probe for")
    }

    func testFINWhileLingeringCloses() {
        var m = machine()
        _ = m.event(.errorQueued)
        XCTAssertEqual(m.event(.outputDrained(now: 0)), .startLingering)
        XCTAssertEqual(m.event(.peerClosed(watched: false)), .close)
    }

    func testShutdownClosesOnlyConnectionsWithNothingBegun() {
        var idle = machine()
        XCTAssertEqual(idle.event(.shutdownBegan(Self.idle)), .close)
        var halfHead = machine()
        _ = halfHead.event(.requestBegan(now: 0))
        XCTAssertEqual(halfHead.event(.shutdownBegan(Self.head)), .none)
        var pending = machine()
        _ = pending.event(.requestDispatched)
        XCTAssertEqual(pending.event(.shutdownBegan(Self.idle)), .none)
        var writing = machine()
        XCTAssertEqual(writing.event(.shutdownBegan(Self.writing)), .none)
    }
}
