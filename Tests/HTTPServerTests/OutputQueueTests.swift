import XCTest
@testable import HTTPServer
import Threads
#if canImport(Glibc)
import Glibc
#endif

/// A connection's output: large bodies queued by reference, order kept, and at most a budget sent per turn.
final class OutputQueueTests: XCTestCase {
    private let date = Array("Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n".utf8)

    private func serialized(_ response: HTTPResponse, isHead: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        serializeResponse(response, into: &out, dateHeader: date, isHead: isHead, keepAlive: true, http10: false)
        return out
    }

    /// A non-blocking socket pair with room for `bytes` in the sending side's buffer.
    private func socketPair(bytes: Int32) throws -> (send: Int32, receive: Int32) {
        var fds: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else {
            throw XCTSkip("socketpair failed: errno \(errno)")
        }
        var size = bytes
        _ = setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        _ = setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
        _ = fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK)
        return (fds[0], fds[1])
    }

    /// Reads whatever is buffered on `fd` (non-blocking), in at most `limit` bytes.
    private func drain(_ fd: Int32, limit: Int) -> [UInt8] {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        for _ in 0..<100_000 where out.count < limit {
            let n = read(fd, &buffer, min(buffer.count, limit - out.count))
            if n <= 0 { break }
            out.append(contentsOf: buffer[0..<n])
        }
        return out
    }

    func testSmallAndLargeAnswersComeOutInOrderAndByteForByteAsSerialised() {
        let large = HTTPResponse(status: 200, body: (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let small = HTTPResponse(status: 404, body: Array("gone".utf8))
        let head = HTTPResponse(status: 200, body: large.body)
        var queue = OutputQueue()
        queue.append(small, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.append(large, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.append(contentsOf: Array("HTTP/1.1 102 Processing\r\n\r\n".utf8))
        queue.append(small, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.append(head, dateHeader: date, isHead: true, keepAlive: true, http10: false)
        let expected = serialized(small) + serialized(large) + Array("HTTP/1.1 102 Processing\r\n\r\n".utf8)
            + serialized(small) + serialized(head, isHead: true)
        XCTAssertEqual(queue.count, expected.count)
        XCTAssertTrue(queue.unsentBytes == expected)
    }

    func testALargeBodyIsQueuedWithoutCopyingItsStorage() {
        let body = [UInt8](repeating: 0x61, count: OutputQueue.shareThreshold)
        var queue = OutputQueue()
        queue.append(HTTPResponse(status: 200, body: body), dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.append(contentsOf: [0x62])
        // The array in the queue still shares the handler's buffer: nothing was appended to it or copied from it.
        var shared = false
        body.withUnsafeBufferPointer { original in
            shared = queue.withChunks { chunks in
                chunks.contains { chunk in chunk.withUnsafeBufferPointer { $0.baseAddress == original.baseAddress } }
            }
        }
        XCTAssertTrue(shared, "the large body was copied")
    }

    /// A body in pieces comes out as the pieces joined, after one head that counts them all; `HEAD` gets the head
    /// alone, and a `304` no body. Each large piece is queued as it is, a small one copied.
    func testABodyInPiecesComesOutJoinedAfterAHeadThatCountsThemAll() {
        let large = [UInt8](repeating: 0x61, count: OutputQueue.shareThreshold)
        for pieces in [[Array("b".utf8)], [large, Array(",c".utf8), large], [[], Array("d".utf8)]] {
            var response = HTTPResponse(status: 200, body: Array("[a".utf8))
            response.bodyPieces = pieces
            let joined = pieces.reduce(response.body, +)
            XCTAssertEqual(response.bodyCount, joined.count)
            let whole = HTTPResponse(status: 200, body: joined)
            var queue = OutputQueue()
            queue.append(response, dateHeader: date, isHead: false, keepAlive: true, http10: false)
            queue.append(response, dateHeader: date, isHead: true, keepAlive: true, http10: false)
            XCTAssertTrue(queue.unsentBytes == serialized(whole) + serialized(whole, isHead: true), "\(pieces.map(\.count))")
            XCTAssertTrue(serialized(response) == serialized(whole), "written in place: \(pieces.map(\.count))")
            var notModified = response
            notModified.status = 304
            XCTAssertEqual(serialized(notModified), serialized(HTTPResponse(status: 304)))
            let shared = large.withUnsafeBufferPointer { original in
                queue.withChunks { chunks in
                    chunks.filter { chunk in chunk.withUnsafeBufferPointer { $0.baseAddress == original.baseAddress } }.count
                }
            }
            XCTAssertEqual(shared, pieces.filter { $0 == large }.count, "each large piece by reference")
        }
    }

    func testSendStopsAtTheBudgetAndTheRestFollowsOnTheNextTurns() throws {
        let body = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        let response = HTTPResponse(status: 200, body: body)
        let expected = serialized(response)
        let (sender, receiver) = try socketPair(bytes: 4 << 20)
        defer { close(sender); close(receiver) }
        var queue = OutputQueue()
        queue.append(response, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        let first = queue.send(to: sender, budget: 50_000)
        XCTAssertEqual(first.0, .budgetSpent)
        XCTAssertEqual(first.1, 50_000)
        XCTAssertEqual(queue.count, expected.count - 50_000)
        var received = drain(receiver, limit: expected.count)
        var turns = 1
        while !queue.isEmpty && turns < 1000 {
            let (outcome, sent) = queue.send(to: sender, budget: 50_000)
            XCTAssertLessThanOrEqual(sent, 50_000)
            XCTAssertNotEqual(outcome, .failed)
            received += drain(receiver, limit: expected.count - received.count)
            turns += 1
        }
        received += drain(receiver, limit: expected.count - received.count)
        XCTAssertTrue(queue.isEmpty)
        XCTAssertGreaterThanOrEqual(turns, expected.count / 50_000)
        XCTAssertEqual(received.count, expected.count)
        XCTAssertTrue(received == expected)
        XCTAssertEqual(queue.send(to: sender, budget: 50_000).0, .drained)
    }

    func testAFullSocketLeavesTheRestQueued() throws {
        let body = [UInt8](repeating: 0x7A, count: 8 << 20)
        let (sender, receiver) = try socketPair(bytes: 64 * 1024)
        defer { close(sender); close(receiver) }
        var queue = OutputQueue()
        queue.append(HTTPResponse(status: 200, body: body), dateHeader: date, isHead: false, keepAlive: true, http10: false)
        let before = queue.count
        let (outcome, sent) = queue.send(to: sender, budget: Int.max)
        XCTAssertEqual(outcome, .wouldBlock)
        XCTAssertGreaterThan(sent, 0)
        XCTAssertEqual(queue.count, before - sent)
    }

    func testAClosedPeerFailsTheSend() throws {
        let (sender, receiver) = try socketPair(bytes: 64 * 1024)
        defer { close(sender) }
        close(receiver)
        var queue = OutputQueue()
        queue.append(contentsOf: Array("HTTP/1.1 200 OK\r\n\r\n".utf8))
        XCTAssertEqual(queue.send(to: sender, budget: 1 << 20).0, .failed)
    }

    /// What a test releaser was handed: the storage addresses of the bodies and whether they came on another thread.
    private final class Released: Sendable {
        private let state = Locked<(addresses: [UInt], onOtherThread: Bool)>(([], true))
        let done: XCTestExpectation

        init(_ done: XCTestExpectation) { self.done = done }

        func record(_ bodies: [[UInt8]], testThread: pthread_t) {
            let other = pthread_equal(pthread_self(), testThread) == 0
            let addresses = bodies.map { body in body.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) } }
            state.withLock { state in
                state.onOtherThread = state.onOtherThread && other
                state.addresses += addresses
            }
            done.fulfill()
        }

        var seen: (addresses: [UInt], onOtherThread: Bool) { state.withLock { $0 } }
    }

    func testALargeBodyIsFreedOffTheSendingThreadOnceSent() throws {
        let body = [UInt8](repeating: 0x71, count: BodyReleaser.threshold)
        let address = body.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
        let released = Released(expectation(description: "the body reached the releaser"))
        let testThread = pthread_self()
        let releaser = BodyReleaser { released.record($0, testThread: testThread) }
        let (sender, receiver) = try socketPair(bytes: 4 << 20)
        defer { close(sender); close(receiver) }
        var queue = OutputQueue(releaser: releaser)
        queue.append(HTTPResponse(status: 200, body: body), dateHeader: date, isHead: false, keepAlive: true, http10: false)
        var received = 0
        var turns = 0
        while !queue.isEmpty && turns < 10_000 {
            XCTAssertNotEqual(queue.send(to: sender, budget: 256 * 1024).0, .failed)
            received += drain(receiver, limit: Int.max).count
            turns += 1
        }
        XCTAssertTrue(queue.isEmpty)
        wait(for: [released.done], timeout: 10)
        let seen = released.seen
        XCTAssertEqual(seen.addresses, [address], "the sent body's own storage is handed over, once")
        XCTAssertTrue(seen.onOtherThread, "the releaser runs on its own queue")
        XCTAssertGreaterThan(received, body.count)
    }

    func testDroppedLargeBodiesAreHandedOverButSmallOnesAreNot() {
        let large = [UInt8](repeating: 0x72, count: BodyReleaser.threshold + 1)
        let small = [UInt8](repeating: 0x73, count: OutputQueue.shareThreshold)
        let address = large.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
        let released = Released(expectation(description: "the body reached the releaser"))
        let testThread = pthread_self()
        let releaser = BodyReleaser { released.record($0, testThread: testThread) }
        var queue = OutputQueue(releaser: releaser)
        queue.append(HTTPResponse(status: 200, body: small), dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.append(HTTPResponse(status: 200, body: large), dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.removeAll()
        XCTAssertTrue(queue.isEmpty)
        wait(for: [released.done], timeout: 10)
        XCTAssertEqual(released.seen.addresses, [address])
    }

    /// Reports when it is let go of, and in `offTestThread` whether that was on another thread than the test's.
    private final class Owner: Sendable {
        private let gone: XCTestExpectation
        private let testThread: pthread_t
        private let offTestThread: Locked<[Bool]>

        init(_ gone: XCTestExpectation, testThread: pthread_t, offTestThread: Locked<[Bool]> = Locked([])) {
            self.gone = gone
            self.testThread = testThread
            self.offTestThread = offTestThread
        }

        deinit {
            let other = pthread_equal(pthread_self(), testThread) == 0
            offTestThread.withLock { $0.append(other) }
            gone.fulfill()
        }
    }

    func testABodysOwnerIsHeldWhileTheBodyIsQueuedThenLetGoOfWithItOffTheSendingThread() throws {
        let body = [UInt8](repeating: 0x74, count: BodyReleaser.threshold)
        let (sender, receiver) = try socketPair(bytes: 4 << 20)
        defer { close(sender); close(receiver) }
        var queue = OutputQueue(releaser: BodyReleaser())
        for dropped in [false, true] {
            let gone = expectation(description: "the owner was let go of (dropped: \(dropped))")
            var response = HTTPResponse(status: 200, body: body)
            let offTestThread = Locked<[Bool]>([])
            var owner: Owner? = Owner(gone, testThread: pthread_self(), offTestThread: offTestThread)
            weak let watched = owner
            response.bodyOwner = owner
            owner = nil
            queue.append(response, dateHeader: date, isHead: false, keepAlive: true, http10: false)
            response = HTTPResponse(status: 200)
            XCTAssertNotNil(watched, "held while its body is queued")
            if dropped {
                queue.removeAll()
            } else {
                var turns = 0
                while !queue.isEmpty && turns < 10_000 {
                    XCTAssertNotEqual(queue.send(to: sender, budget: 256 * 1024).0, .failed)
                    _ = drain(receiver, limit: Int.max)
                    turns += 1
                }
            }
            XCTAssertTrue(queue.isEmpty)
            wait(for: [gone], timeout: 10)
            XCTAssertNil(watched)
            XCTAssertEqual(offTestThread.withLock { $0 }, [true], "let go of on the releaser's queue, with its body")
        }
    }

    func testTheOwnerOfASmallBodyIsNotKept() {
        let gone = expectation(description: "the owner was let go of")
        var response = HTTPResponse(status: 200, body: Array("small".utf8))
        response.bodyOwner = Owner(gone, testThread: pthread_self())
        var queue = OutputQueue(releaser: BodyReleaser())
        queue.append(response, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        response = HTTPResponse(status: 200)
        wait(for: [gone], timeout: 10)
        XCTAssertFalse(queue.isEmpty, "a small body is copied into the queue: its owner has nothing to hold")
    }
    // MARK: Bodies kept in files

    /// A file of `bytes`, open for reading, already unlinked; the caller closes it.
    private func file(_ bytes: [UInt8]) throws -> Int32 {
        let path = NSTemporaryDirectory() + "output-queue-\(UUID().uuidString)"
        guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else {
            throw XCTSkip("cannot make a file in \(NSTemporaryDirectory())")
        }
        let fd = open(path, O_RDONLY)
        unlink(path)
        guard fd >= 0 else { throw XCTSkip("cannot open \(path): errno \(errno)") }
        return fd
    }

    /// Closes its file when let go of, and says on which thread.
    private final class FileOwner: Sendable {
        let fd: Int32
        private let owner: Owner

        init(fd: Int32, _ owner: Owner) {
            self.fd = fd
            self.owner = owner
        }

        deinit { close(fd) }
    }

    func testABodyInAFileIsSentFromItInOrderWithinTheBudgetThenItsOwnerLetGoOfOffTheSendingThread() throws {
        let bytes = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 11) }
        let gone = expectation(description: "the file's owner was let go of")
        let offTestThread = Locked<[Bool]>([])
        var fileOwner: FileOwner? = FileOwner(
            fd: try file(bytes), Owner(gone, testThread: pthread_self(), offTestThread: offTestThread))
        weak let watched = fileOwner
        var response = HTTPResponse(status: 200)
        response.bodyFile = HTTPFileBody(fd: fileOwner?.fd ?? -1, count: bytes.count)
        response.bodyOwner = fileOwner
        fileOwner = nil
        let small = HTTPResponse(status: 404, body: Array("gone".utf8))
        var queue = OutputQueue(releaser: BodyReleaser())
        queue.append(small, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        queue.append(response, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        // A HEAD answer has the file's length, and no body: the file is not queued for it.
        queue.append(response, dateHeader: date, isHead: true, keepAlive: true, http10: false)
        queue.append(small, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        response = HTTPResponse(status: 200)
        let inMemory = HTTPResponse(status: 200, body: bytes)
        let expected = serialized(small) + serialized(inMemory) + serialized(inMemory, isHead: true) + serialized(small)
        XCTAssertEqual(queue.count, expected.count)
        XCTAssertTrue(queue.unsentBytes == expected)
        XCTAssertNotNil(watched, "held while its file is queued")

        let (sender, receiver) = try socketPair(bytes: 4 << 20)
        defer { close(sender); close(receiver) }
        var received: [UInt8] = []
        var turns = 0
        while !queue.isEmpty && turns < 10_000 {
            let (outcome, sent) = queue.send(to: sender, budget: 50_000)
            XCTAssertNotEqual(outcome, .failed)
            XCTAssertLessThanOrEqual(sent, 50_000)
            received += drain(receiver, limit: expected.count - received.count)
            turns += 1
        }
        received += drain(receiver, limit: expected.count - received.count)
        XCTAssertEqual(received.count, expected.count)
        XCTAssertTrue(received == expected, "the file's bytes, between the answers before and after it")
        wait(for: [gone], timeout: 10)
        XCTAssertNil(watched)
        XCTAssertEqual(offTestThread.withLock { $0 }, [true], "let go of on the releaser's queue")
    }

    func testAFileShorterThanItsAnswerSaysFailsTheSendRatherThanLeaveThePeerWaiting() throws {
        let fd = try file([UInt8](repeating: 0x66, count: 1000))
        defer { close(fd) }
        var response = HTTPResponse(status: 200)
        response.bodyFile = HTTPFileBody(fd: fd, count: 5000)
        var queue = OutputQueue()
        queue.append(response, dateHeader: date, isHead: false, keepAlive: true, http10: false)
        let (sender, receiver) = try socketPair(bytes: 4 << 20)
        defer { close(sender); close(receiver) }
        XCTAssertEqual(queue.send(to: sender, budget: 1 << 20).0, .failed)
    }
}
