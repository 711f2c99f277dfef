import CHTTPLinux
import Glibc

/// What a connection has still to send, in order: bytes the loop serialised (heads, small bodies, stream chunks),
/// large bodies kept as the handler's own arrays, and bodies kept in files (`HTTPResponse.bodyFile`). A large body
/// is never copied on the loop (a 100 MB answer would hold it for tens of milliseconds of `memcpy` and page
/// faults), only referenced: `[UInt8]` is copy-on-write and nothing here mutates it; a file's bytes go from the
/// page cache to the socket (`sendfile`).
struct OutputQueue {
    /// Bodies at least this large are queued by reference; smaller ones are copied after their head, so that a
    /// small answer still goes out in one `send`.
    static let shareThreshold = 64 * 1024

    /// The first chunk has been sent up to `offset`.
    private var chunks: [[UInt8]] = []
    /// Each chunk's owner (`HTTPResponse.bodyOwner`, for a shared body; `nil` otherwise), held as long as it.
    private var owners: [(any AnyObject & Sendable)?] = []
    /// Each chunk's file, for a body kept in one (its bytes in `chunks` are then empty); `nil` otherwise.
    private var files: [HTTPFileBody?] = []
    private var offset = 0
    /// Whether the last chunk is a shared body (appending to it would copy it).
    private var lastIsShared = false
    /// Bytes not sent yet.
    private(set) var count = 0
    /// Where large chunks go once sent or dropped, to be freed off the loop.
    private let releaser: BodyReleaser

    init(releaser: BodyReleaser = .shared) {
        self.releaser = releaser
    }

    var isEmpty: Bool { count == 0 }

    /// Copies `bytes` to the end of the queue.
    mutating func append<Bytes: Collection>(contentsOf bytes: Bytes) where Bytes.Element == UInt8 {
        guard !bytes.isEmpty else { return }
        if chunks.isEmpty || lastIsShared {
            chunks.append(Array(bytes))
            owners.append(nil)
            files.append(nil)
            lastIsShared = false
        } else {
            chunks[chunks.count - 1].append(contentsOf: bytes)
        }
        count += bytes.count
    }

    /// Queues `body` after what is queued: by reference, held with its `owner`, when it is large, else copied.
    mutating func append(body: [UInt8], owner: (any AnyObject & Sendable)? = nil) {
        guard body.count >= Self.shareThreshold else {
            append(contentsOf: body)
            return
        }
        chunks.append(body)
        owners.append(owner)
        files.append(nil)
        lastIsShared = true
        count += body.count
    }

    /// Queues the body kept in `file` after what is queued, held with its `owner` (which keeps the file open).
    mutating func append(file: HTTPFileBody, owner: (any AnyObject & Sendable)?) {
        guard file.count > 0 else { return }
        chunks.append([])
        owners.append(owner)
        files.append(file)
        lastIsShared = true
        count += file.count
    }

    /// Serialises `response` (see `serializeResponse`), its body queued by reference when large.
    mutating func append(_ response: HTTPResponse, dateHeader: [UInt8], isHead: Bool, keepAlive: Bool, http10: Bool,
                         streamed: StreamFraming? = nil) {
        let sendsBody = streamed == nil && !isHead && !(response.status < 200 || response.status == 204 || response.status == 304)
        var head: [UInt8] = []
        if let file = response.bodyFile {
            serializeResponse(response, into: &head, dateHeader: dateHeader, isHead: isHead, keepAlive: keepAlive,
                              http10: http10, streamed: streamed, omitBody: true)
            append(contentsOf: head)
            if sendsBody { append(file: file, owner: response.bodyOwner) }
        } else if sendsBody && (response.body.count >= Self.shareThreshold || !response.bodyPieces.isEmpty) {
            // The head is written from a copy without the body; `Content-Length` still comes from the real one.
            serializeResponse(response, into: &head, dateHeader: dateHeader, isHead: isHead, keepAlive: keepAlive,
                              http10: http10, streamed: streamed, omitBody: true)
            append(contentsOf: head)
            append(body: response.body, owner: response.bodyOwner)
            for piece in response.bodyPieces { append(body: piece, owner: response.bodyOwner) }
        } else {
            serializeResponse(response, into: &head, dateHeader: dateHeader, isHead: isHead, keepAlive: keepAlive,
                              http10: http10, streamed: streamed)
            append(contentsOf: head)
        }
    }

    /// What `send` did.
    enum WriteOutcome: Equatable {
        /// Everything queued was sent.
        case drained
        /// The socket takes no more for now.
        case wouldBlock
        /// `budget` bytes were sent and more is queued: the loop serves its other connections first.
        case budgetSpent
        /// The socket failed (the peer is gone).
        case failed
    }

    /// Sends from the head of the queue until it is empty, the socket would block, or `budget` bytes went out.
    /// - Returns: the outcome and the bytes sent.
    mutating func send(to fd: Int32, budget: Int) -> (WriteOutcome, Int) {
        var sent = 0
        // `chunks[0]` is used in place, never copied to a local: a copy would keep a sent body alive on the loop
        // after it is handed to the releaser.
        while !chunks.isEmpty {
            if sent >= budget { return (.budgetSpent, sent) }
            let file = files[0]
            let want = min((file?.count ?? chunks[0].count) - offset, budget - sent)
            let start = offset
            let result: IOResult<Int>
            do {
                if let file {
                    result = try systemCall("sendfile") {
                        var from = off_t(start)
                        return CHTTPLinux.sendfile(fd, file.fd, &from, want)
                    }
                } else {
                    result = try systemCall("send") {
                        chunks[0].withUnsafeBytes { buffer -> Int in
                            guard let base = buffer.baseAddress else { return 0 }
                            return Glibc.send(fd, base + start, want, Int32(MSG_NOSIGNAL))
                        }
                    }
                }
            } catch {
                return (.failed, sent)
            }
            guard case .processed(let written) = result else { return (.wouldBlock, sent) }
            // A file that ends early (cut short by someone else) sends nothing: the peer would wait for the rest.
            if written == 0 && want > 0 { return (.failed, sent) }
            sent += written
            count -= written
            offset += written
            if offset == (file?.count ?? chunks[0].count) {
                release(0)
                chunks.removeFirst()
                owners.removeFirst()
                files.removeFirst()
                offset = 0
                if chunks.isEmpty { lastIsShared = false }
            }
        }
        return (.drained, sent)
    }

    /// Hands chunk `k` to the releaser if it is large: a body, or a file's owner (whose last reference may
    /// close a file of many megabytes, which frees its pages).
    private mutating func release(_ k: Int) {
        if files[k] != nil {
            releaser.release(&chunks[k], owner: &owners[k])
        } else {
            releaser.releaseIfLarge(&chunks[k], owner: &owners[k])
        }
    }

    /// Drops everything queued.
    mutating func removeAll() {
        for k in chunks.indices { release(k) }
        chunks = []
        owners = []
        files = []
        offset = 0
        count = 0
        lastIsShared = false
    }

    /// Lends the queued chunks (tests look at whose storage they are).
    func withChunks<T>(_ body: ([[UInt8]]) -> T) -> T { body(chunks) }

    /// The unsent bytes, in order (tests).
    var unsentBytes: [UInt8] {
        var bytes: [UInt8] = []
        for (i, chunk) in chunks.enumerated() {
            let start = i == 0 ? offset : 0
            guard let file = files[i] else {
                bytes.append(contentsOf: chunk[start...])
                continue
            }
            var read = [UInt8](repeating: 0, count: file.count - start)
            let got = read.withUnsafeMutableBytes { pread(file.fd, $0.baseAddress, $0.count, off_t(start)) }
            bytes.append(contentsOf: read.prefix(max(0, got)))
        }
        return bytes
    }
}
