import CCurl
import Threads

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Cancels one transfer started by `Fetcher.start`.
public final class FetchHandle: @unchecked Sendable {
    // @unchecked: `loop` is weak and never reassigned; `transfer` is immutable and `FetchLoop.cancel` touches it
    // only with the loop's `mutex` held.
    private weak var loop: FetchLoop?
    private let transfer: Transfer

    init(loop: FetchLoop?, transfer: Transfer) {
        self.loop = loop
        self.transfer = transfer
    }

    /// Aborts the transfer (closing its connection) or its backoff wait; the
    /// completion then reports kind `cancelled`. Idempotent; callable from any
    /// thread; does nothing once the transfer completed.
    public func cancel() {
        loop?.cancel(transfer)
    }
}

/// Runs HTTP transfers with libcurl: one thread drives one `curl_multi` handle
/// for every transfer of the process.
///
/// libcurl does connection reuse, the total and per-host connection limits,
/// redirects (at most 5, http/https only), timeouts and HTTP/2 where TLS offers
/// it. The deny list is checked on each resolved address before its socket is
/// opened, as what the address reaches (`AddressRange.denial(of:by:)`). Bodies
/// are asked for and decoded in every encoding libcurl knows (gzip, deflate,
/// br, zstd); the body limit counts decoded bytes. `start` and
/// `FetchHandle.cancel` may be called from any thread: they queue the work and
/// wake the fetcher's thread, which makes every curl call.
///
/// Error kinds (API.md §1.3) by cause:
/// - `dns`: the host does not resolve (not retried).
/// - `connect`: refused, reset, closed without an answer, an answer that is not
///   HTTP, send/receive errors (retried); also, not retried: an address in the
///   deny list ("address … is denied (cidr)"), a scheme other than http/https,
///   directly or by redirect ("refused protocol"), a malformed URL, a body whose
///   content encoding does not decode.
/// - `too_many_redirects`: more than 5 redirects (not retried).
/// - `resource_exhausted`: this process could not open a socket (out of file
///   descriptors, buffers or local ports): retried, since it passes.
/// - `timeout`: the attempt's `timeoutMs` or the connect timeout passed (retried).
/// - `tls`: handshake or certificate failures (not retried).
/// - `too_large`: a declared `Content-Length` or the decoded bytes received
///   exceed the limit; a header line over libcurl's 100 KiB, or a header
///   section over `Transfer.maxHeaderBytes` (256 KiB).
///   Also (not retried) when the job's `ByteBudget` cannot take a declared
///   length or the bytes received: the job's responses together are over it;
///   and (retried) when the server's, which the job's draws on, cannot: all
///   jobs' responses in memory together are over `--max-response-memory`.
/// - `http_status`: a final status outside 2xx and `acceptStatus` (5xx and 429 retried).
/// - `invalid_json`: `expect: json` and the body does not parse.
/// - `cancelled`: `FetchHandle.cancel()` or `shutdown()`.
/// Retries happen only for idempotent requests; the wait is `retryBackoffMs`
/// doubled per attempt with ±20 % jitter, or a `Retry-After` in seconds (at most 60).
public final class Fetcher: @unchecked Sendable {
    // @unchecked: its one stored property is an immutable reference to the `FetchLoop`, which guards itself.
    private let loop: FetchLoop

    /// Starts the fetcher's thread.
    /// - Throws: `FetcherError` for an invalid deny CIDR or when libcurl cannot start.
    public init(configuration: FetcherConfiguration) throws {
        loop = try FetchLoop(configuration: configuration)
    }

    deinit { loop.shutdown() }

    /// Starts a transfer, with its retries.
    ///
    /// - Parameters:
    ///   - request: what to fetch.
    ///   - timeoutMs: the limit of each attempt's whole transfer, connect included; none if `nil`.
    ///   - budget: the job's byte budget, which every body chunk received is counted against; the chunk that
    ///     would cross it fails the transfer with `too_large` (not retried). `nil`: no budget.
    ///   - onAttempt: called on the fetcher's thread when attempt `n` (from 1) starts.
    ///   - completion: called exactly once with the outcome, on the fetcher's thread
    ///     (on the caller's thread if the fetcher is already shut down).
    /// - Returns: a handle that cancels the transfer.
    @discardableResult
    public func start(
        _ request: FetchRequest, timeoutMs: Int? = nil, budget: ByteBudget? = nil,
        onAttempt: (@Sendable (Int) -> Void)? = nil, completion: @escaping @Sendable (FetchOutcome) -> Void
    ) -> FetchHandle {
        loop.start(request, timeoutMs: timeoutMs, budget: budget, onAttempt: onAttempt, completion: completion)
    }

    /// Transfers started and not yet completed (backoff waits included).
    public var inFlight: Int { loop.inFlight }

    /// The most transfers to one plain-HTTP (`http://`) host that run at once, however many are started: libcurl
    /// opens at most `maxPerHost` connections to a host, HTTP/1.1 carries one transfer on each, and a transfer
    /// beyond them waits in libcurl until one is free, then starts in the same turn of the fetcher's loop. `nil`
    /// with a proxy, whose connections are the ones counted. Over TLS, HTTP/2 carries many transfers on one
    /// connection, so there the count of connections bounds nothing.
    public var plainHTTPTransfersPerHost: Int? { loop.plainHTTPTransfersPerHost }

    /// A snapshot of the counters.
    public var stats: FetcherStats { loop.stats }

    /// Waits, for at most `milliseconds`, until `accept` holds for the counters (at once, and after each change);
    /// the answer is whether it held. `accept` must be quick: the fetcher's thread waits while it runs.
    public func waitForStats(milliseconds: Int64, until accept: (FetcherStats) -> Bool) -> Bool {
        loop.waitForStats(milliseconds: milliseconds, until: accept)
    }

    /// Cancels every transfer (each completes with `cancelled`), stops the thread
    /// and waits for it. Later `start` calls complete at once with `cancelled`.
    public func shutdown() { loop.shutdown() }
}

/// `curl_global_init` once per process, before the first handle.
private let curlGlobal: CURLcode = curl_global_init(Int(CURL_GLOBAL_ALL))

/// One `start` call, across its attempts. Mutable fields other than
/// `cancelRequested` belong to the fetcher's thread.
final class Transfer {
    enum Phase { case queued, running, backoff(dueMs: Int64), done }

    let request: FetchRequest
    let method: String
    let timeoutMs: Int?
    let maxBytes: Int
    /// The job's budget the body bytes are counted against, if any. Let go of when the transfer completes, before its
    /// completion runs: the bytes its answer holds stay counted, and go back when the job lets go of the budget.
    var budget: ByteBudget?
    /// What the current attempt's body took from `budget`, and what `lastResponse`'s body holds of it.
    var countedBytes = 0
    var lastResponseCounted = 0
    // Dropped once the transfer completes, so a closure that captures the
    // transfer's handle does not keep both alive.
    var onAttempt: (@Sendable (Int) -> Void)?
    var completion: (@Sendable (FetchOutcome) -> Void)?
    let startedMs: Int64
    let denyList: [AddressRange]

    /// Guarded by the loop's mutex.
    var cancelRequested = false

    var phase = Phase.queued
    var attempts = 0
    var lastResponse: FetchResponse?

    // The current attempt.
    var easy: UnsafeMutableRawPointer?
    var headerList: UnsafeMutablePointer<curl_slist>?
    let errorBuffer: UnsafeMutablePointer<CChar>
    var body: [UInt8] = []
    var headers: [(name: String, value: String)] = []
    var status = 0
    /// Why the attempt is over its size limits, once it is.
    var tooLargeReason: String?
    /// The budget whose crossing ended the attempt, if one did (`--max-response-memory` frees as other jobs end).
    var refusedBy: ByteBudget.Scope?
    var deniedMessage: String?
    /// The current response's header bytes so far, reset by each status line.
    var headerBytes = 0
    /// The blank line ending the current response's header section was seen.
    var headersEnded = false
    /// `errno` of a failed `socket()` in the opensocket callback.
    var socketErrno: Int32 = 0

    init(request: FetchRequest, timeoutMs: Int?, maxBytes: Int, budget: ByteBudget? = nil, denyList: [AddressRange],
         onAttempt: (@Sendable (Int) -> Void)?, completion: @escaping @Sendable (FetchOutcome) -> Void) {
        self.request = request
        self.method = request.method.uppercased()
        self.timeoutMs = timeoutMs
        self.maxBytes = maxBytes
        self.budget = budget
        self.denyList = denyList
        self.onAttempt = onAttempt
        self.completion = completion
        self.startedMs = Timestamp.monotonicMs()
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
    }

    deinit {
        errorBuffer.deallocate()
    }

    func resetAttempt() {
        body = []
        headers = []
        status = 0
        tooLargeReason = nil
        refusedBy = nil
        deniedMessage = nil
        headerBytes = 0
        headersEnded = false
        socketErrno = 0
        errorBuffer[0] = 0
    }

    /// Records one header line of a response; a status line starts a new response
    /// (a redirect hop or an interim `100`), so only the final one's fields remain.
    /// Returns false when a declared length already exceeds the limit, or the
    /// header section exceeds `Transfer.maxHeaderBytes`.
    func headerLine(_ line: UnsafeBufferPointer<UInt8>) -> Bool {
        // Read as bytes: String's Character-wise searches cost more than the
        // rest of a small transfer together.
        var end = line.count
        while end > 0, line[end - 1] == 10 || line[end - 1] == 13 { end -= 1 }
        if end == 0 {
            headersEnded = true
            return checkDeclaredLength()
        }
        if end >= 5, line[0] == 72, line[1] == 84, line[2] == 84, line[3] == 80, line[4] == 47 {  // "HTTP/"
            // Room for a typical response's fields at once, rather than grown one doubling at a time.
            headers = []
            headers.reserveCapacity(Transfer.usualHeaderCount)
            headerBytes = 0
            headersEnded = false
            status = Transfer.statusCode(line, end: end)
            return true
        }
        // libcurl limits one line (100 KiB) but not how many: this bounds the
        // memory a hostile upstream can make the header list take.
        headerBytes += line.count
        if headerBytes > Transfer.maxHeaderBytes {
            tooLargeReason = "response header section larger than \(Transfer.maxHeaderBytes) bytes"
            return false
        }
        if line[0] == 32 || line[0] == 9 {
            // obs-fold continuation of the previous field
            if let lastIndex = headers.indices.last {
                headers[lastIndex].value += " " + Transfer.trimmed(line, from: 0, to: end)
            }
            return true
        }
        var colon = 0
        while colon < end, line[colon] != 58 { colon += 1 }
        guard colon < end else { return true }
        let name = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(colon, 1)) { lower -> String in
            for i in 0..<colon {
                let byte = line[i]
                lower[i] = byte >= 65 && byte <= 90 ? byte + 32 : byte
            }
            return String(decoding: UnsafeBufferPointer(rebasing: lower[0..<colon]), as: UTF8.self)
        }
        let value = Transfer.trimmed(line, from: colon + 1, to: end)
        if let index = headers.firstIndex(where: { $0.name == name }) {
            headers[index].value += ", " + value
        } else {
            headers.append((name: name, value: value))
        }
        return true
    }

    /// The code of a status line (`HTTP/1.1 200 OK`, `HTTP/2 204`); 0 if it has none.
    static func statusCode(_ line: UnsafeBufferPointer<UInt8>, end: Int) -> Int {
        var i = 0
        while i < end, line[i] != 32 { i += 1 }
        while i < end, line[i] == 32 { i += 1 }
        var code = 0
        var digits = 0
        while i < end, line[i] != 32 {
            guard line[i] >= 48, line[i] <= 57, digits < 3 else { return 0 }
            code = code * 10 + Int(line[i] - 48)
            digits += 1
            i += 1
        }
        return digits == 3 ? code : 0
    }

    /// `line[from..<to]` without leading and trailing spaces and tabs.
    static func trimmed(_ line: UnsafeBufferPointer<UInt8>, from: Int, to: Int) -> String {
        var start = from
        var stop = to
        while start < stop, line[start] == 32 || line[start] == 9 { start += 1 }
        while stop > start, line[stop - 1] == 32 || line[stop - 1] == 9 { stop -= 1 }
        return String(decoding: UnsafeBufferPointer(rebasing: line[start..<stop]), as: UTF8.self)
    }

    private func checkDeclaredLength() -> Bool {
        if request.followRedirects, (300..<400).contains(status), headers.contains(where: { $0.name == "location" }) {
            return true
        }
        // An encoded body's Content-Length counts the encoded bytes, and the
        // limit counts decoded ones: only the body itself can tell.
        if let encoding = headers.first(where: { $0.name == "content-encoding" }),
            encoding.value.lowercased() != "identity"
        {
            return true
        }
        guard method != "HEAD", let declared = headers.first(where: { $0.name == "content-length" }),
            let length = Int(declared.value), length >= 0
        else { return true }
        if length > maxBytes {
            tooLargeReason = bodyTooLarge
            return false
        }
        // A declared length the job's budget (or the server's it draws on) cannot take fails before any of it
        // arrives (other fetches may take some of what is left meanwhile, so the body itself is still counted).
        if let refused = budget?.refusal(declared: length) {
            refuse(refused)
            return false
        }
        // One buffer of the declared size, within the limits just checked: grown by doubling instead, a 10 MB
        // body would be copied some 20 times and end in a 16 MiB buffer.
        if body.isEmpty { body.reserveCapacity(length) }
        return true
    }

    private func refuse(_ budget: ByteBudget) {
        tooLargeReason = budget.exceeded
        refusedBy = budget.scope
    }

    /// How many header fields `headers` has room for when a response begins (nginx sends 8 with a file).
    static let usualHeaderCount = 12

    /// The largest header section accepted per response (status line excluded).
    static let maxHeaderBytes = 256 * 1024

    var bodyTooLarge: String { "response larger than \(maxBytes) bytes" }

    /// Receives the body as decoded (gzip, deflate, br, zstd), so the limit counts decoded bytes.
    func bodyChunk(_ chunk: UnsafeBufferPointer<UInt8>) -> Bool {
        if body.count + chunk.count > maxBytes {
            tooLargeReason = bodyTooLarge
            return false
        }
        if let budget {
            if let refused = budget.refusal(taking: chunk.count) {
                refuse(refused)
                return false
            }
            countedBytes += chunk.count
        }
        body.append(contentsOf: chunk)
        return true
    }

    /// The words for an `errno` that means this process ran out of descriptors,
    /// buffers or local ports; `nil` for any other.
    static func exhaustion(_ code: Int32) -> String? {
        let name: String
        switch code {
        case EMFILE: name = "EMFILE"
        case ENFILE: name = "ENFILE"
        case ENOBUFS: name = "ENOBUFS"
        case ENOMEM: name = "ENOMEM"
        case EADDRNOTAVAIL: name = "EADDRNOTAVAIL, no free local port"
        default: return nil
        }
        return "\(String(cString: strerror(code))) (\(name)) on this server"
    }

    /// The opensocket check: false (and a message) for an address in the deny list.
    func allows(_ address: [UInt8]) -> Bool {
        guard let denial = AddressRange.denial(of: address, by: denyList) else { return true }
        deniedMessage = denial
        return false
    }
}

// MARK: - C callbacks

private let writeCallback: curl_write_callback = { data, size, count, user in
    guard let user else { return 0 }
    let transfer = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
    let length = size * count
    guard let data, length > 0 else { return length }
    let chunk = UnsafeBufferPointer(start: UnsafeRawPointer(data).assumingMemoryBound(to: UInt8.self), count: length)
    return transfer.bodyChunk(chunk) ? length : 0
}

private let headerCallback: curl_write_callback = { data, size, count, user in
    guard let user else { return 0 }
    let transfer = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
    let length = size * count
    guard let data, length > 0 else { return length }
    let line = UnsafeBufferPointer(start: UnsafeRawPointer(data).assumingMemoryBound(to: UInt8.self), count: length)
    return transfer.headerLine(line) ? length : 0
}

private let openSocketCallback: curl_opensocket_callback = { user, purpose, address in
    guard let address else { return CURL_SOCKET_BAD }
    let family = address.pointee.family
    if let user, purpose == CURLSOCKTYPE_IPCXN {
        let transfer = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
        guard let offset = MemoryLayout<curl_sockaddr>.offset(of: \curl_sockaddr.addr) else { return CURL_SOCKET_BAD }
        let raw = UnsafeMutableRawPointer(address) + offset
        var bytes: [UInt8] = []
        if family == AF_INET {
            let sin = raw.load(as: sockaddr_in.self)
            bytes = withUnsafeBytes(of: sin.sin_addr) { Array($0) }
        } else if family == AF_INET6 {
            let sin6 = raw.load(as: sockaddr_in6.self)
            bytes = withUnsafeBytes(of: sin6.sin6_addr) { Array($0) }
        }
        if bytes.isEmpty || !transfer.allows(bytes) {
            if bytes.isEmpty { transfer.deniedMessage = "address family \(family) is not IPv4 or IPv6" }
            return CURL_SOCKET_BAD
        }
        let fd = socket(family, address.pointee.socktype | Int32(SOCK_CLOEXEC.rawValue), address.pointee.protocol)
        if fd < 0 { transfer.socketErrno = errno }
        return fd
    }
    return socket(family, address.pointee.socktype | Int32(SOCK_CLOEXEC.rawValue), address.pointee.protocol)
}

// MARK: - The loop

/// The state owned by the fetcher's thread, plus the locked queue that feeds it.
final class FetchLoop: @unchecked Sendable {
    // @unchecked: the properties marked "Guarded by `mutex`" are touched only with `mutex` held; those marked
    // "The fetcher's thread only" only on the thread `init` starts; the rest is immutable.
    private let configuration: FetcherConfiguration
    private let denyList: [AddressRange]
    /// The system's roots plus `--ca-file`; `nil` without `--ca-file` (libcurl then reads the system's own).
    private let roots: TrustedRoots?
    /// `configuration.userAgent` and `.proxy` (`""`: none) as C strings, made once: a short Swift string handed to
    /// a C parameter is copied out to a new array on every call.
    private let userAgent: ContiguousArray<CChar>
    private let proxy: ContiguousArray<CChar>
    private let multi: UnsafeMutableRawPointer
    private let mutex = Lock()
    /// The counters `stats` reports, which `waitForStats` waits on; they guard themselves.
    private let counters = Watched(FetcherStats())

    // Guarded by `mutex`.
    private var incoming: [Transfer] = []
    private var cancels: [Transfer] = []
    private var stopping = false
    private var closed = false
    private var thread: pthread_t?
    /// The fetcher's thread once it runs: work queued from it needs no wakeup,
    /// since the loop drains the queue before it polls again.
    private var loopThread: pthread_t?

    // The fetcher's thread only.
    private var running: [ObjectIdentifier: Transfer] = [:]
    /// Transfers waiting out a retry backoff; their count is published in `stats.backingOff`.
    private var waiting: [Transfer] = [] {
        didSet { let count = waiting.count; counters.withLock { $0.backingOff = count } }
    }
    private var random = SystemRandomNumberGenerator()
    /// Easy handles of finished attempts, reset (`curl_easy_reset` keeps no option; the connections belong to the
    /// multi handle), for the next attempts: a new handle per transfer made malloc, free and malloc_consolidate a
    /// large part of this thread's time.
    private var spareHandles: [UnsafeMutableRawPointer] = []
    static let maxSpareHandles = 64

    init(configuration: FetcherConfiguration) throws {
        guard curlGlobal == CURLE_OK else { throw FetcherError("curl_global_init failed") }
        self.configuration = configuration
        denyList = try configuration.denyCIDRs.map { try AddressRange(cidr: $0) }
        roots = try configuration.caFile.map { try TrustedRoots(caFile: $0) }
        userAgent = configuration.userAgent.utf8CString
        proxy = (configuration.proxy ?? "").utf8CString
        guard configuration.maxConcurrentFetches > 0, configuration.maxPerHost > 0 else {
            throw FetcherError("connection limits must be positive")
        }
        guard let multi = curl_multi_init() else { throw FetcherError("curl_multi_init failed") }
        self.multi = multi
        ccurl_multi_setopt_long(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, configuration.maxConcurrentFetches)
        ccurl_multi_setopt_long(multi, CURLMOPT_MAX_HOST_CONNECTIONS, configuration.maxPerHost)
        ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, configuration.maxConcurrentFetches)
        ccurl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))

        do throws(ThreadStartError) {
            // The closure keeps the loop alive until its thread ends.
            thread = try startThread(name: "fetcher") { self.run() }
        } catch {
            curl_multi_cleanup(multi)
            throw FetcherError("cannot start the fetcher's thread (error \(error.errno))")
        }
    }

    var inFlight: Int { counters.withLock { $0.inFlight } }
    var stats: FetcherStats { counters.withLock { $0 } }

    func waitForStats(milliseconds: Int64, until accept: (FetcherStats) -> Bool) -> Bool {
        counters.wait(milliseconds: milliseconds, until: accept)
    }
    var plainHTTPTransfersPerHost: Int? { (configuration.proxy ?? "").isEmpty ? configuration.maxPerHost : nil }

    func start(
        _ request: FetchRequest, timeoutMs: Int?, budget: ByteBudget?, onAttempt: (@Sendable (Int) -> Void)?,
        completion: @escaping @Sendable (FetchOutcome) -> Void
    ) -> FetchHandle {
        let transfer = Transfer(
            request: request, timeoutMs: timeoutMs, maxBytes: request.maxBytes ?? configuration.maxResponseBytes,
            budget: budget, denyList: denyList, onAttempt: onAttempt, completion: completion)
        // Counted before the loop can see it, so that its end never comes first.
        counters.withLock { $0.inFlight += 1 }
        let accepted = mutex.withLock { () -> Bool in
            guard !stopping else { return false }
            wakeIfFirstQueued()
            incoming.append(transfer)
            return true
        }
        if !accepted {
            counters.withLock { $0.inFlight -= 1 }
            transfer.phase = .done
            completion(FetchOutcome(
                result: .failure(NodeError(.cancelled, "\(transfer.method) \(request.url) cancelled: the fetcher is shut down")),
                attempts: 0, lastResponse: nil))
        }
        return FetchHandle(loop: self, transfer: transfer)
    }

    func cancel(_ transfer: Transfer) {
        mutex.withLock {
            guard !closed, !transfer.cancelRequested else { return }
            transfer.cancelRequested = true
            wakeIfFirstQueued()
            cancels.append(transfer)
        }
    }

    /// Called with the mutex held, before queueing work. Only the first piece
    /// of work queued since the loop's last drain needs a wakeup: the loop
    /// drains everything queued before it polls again, so a wakeup per start
    /// (a syscall, and a pass of the loop over every transfer) buys nothing.
    private func wakeIfFirstQueued() {
        guard incoming.isEmpty, cancels.isEmpty else { return }
        if let loopThread, pthread_equal(loopThread, pthread_self()) != 0 { return }
        curl_multi_wakeup(multi)
    }

    func shutdown() {
        let toJoin: pthread_t? = mutex.withLock {
            stopping = true
            if !closed { curl_multi_wakeup(multi) }
            let t = thread
            thread = nil
            return t
        }
        guard let toJoin else { return }
        if pthread_equal(toJoin, pthread_self()) != 0 {
            // Called from a completion on the fetcher's own thread: it exits after this pass.
            pthread_detach(toJoin)
            return
        }
        pthread_join(toJoin, nil)
    }

    // MARK: the fetcher's thread

    private func run() {
        var stillRunning: Int32 = 0
        mutex.withLock { loopThread = pthread_self() }
        while true {
            let (starts, cancelled, stop) = mutex.withLock { () -> ([Transfer], [Transfer], Bool) in
                defer {
                    incoming.removeAll(keepingCapacity: true)
                    cancels.removeAll(keepingCapacity: true)
                }
                // A transfer cancelled before it began is completed by the cancel pass, never started.
                return (incoming.filter { !$0.cancelRequested }, cancels, stopping)
            }
            for transfer in starts { beginAttempt(transfer) }
            for transfer in cancelled { abort(transfer) }
            if stop { break }
            fireDueBackoffs()
            curl_multi_perform(multi, &stillRunning)
            collectFinished()

            // Completions may have queued work without a wakeup: go round again at once.
            let queued = mutex.withLock { !incoming.isEmpty || !cancels.isEmpty }
            var waitMs = queued ? 0 : 1000
            var curlTimeout = -1
            curl_multi_timeout(multi, &curlTimeout)
            if curlTimeout >= 0 { waitMs = min(waitMs, curlTimeout) }
            if let due = nextBackoffDue() { waitMs = min(waitMs, max(0, Int(due - Timestamp.monotonicMs()))) }
            if waitMs > 0 { curl_multi_poll(multi, nil, 0, Int32(waitMs), nil) }
        }
        let leftovers = mutex.withLock { () -> [Transfer] in
            let list = incoming
            incoming.removeAll()
            return list
        }
        for transfer in Array(running.values) + waiting + leftovers { abort(transfer) }
        for easy in spareHandles { curl_easy_cleanup(easy) }
        spareHandles.removeAll()
        mutex.withLock { closed = true }
        curl_multi_cleanup(multi)
    }

    private func beginAttempt(_ transfer: Transfer) {
        if case .done = transfer.phase { return }
        transfer.attempts += 1
        counters.withLock { $0.attempts += 1 }
        transfer.onAttempt?(transfer.attempts)
        transfer.resetAttempt()
        guard let easy = spareHandles.popLast() ?? curl_easy_init() else {
            complete(transfer, .failure(NodeError(.internal, "curl_easy_init failed")))
            return
        }
        transfer.easy = easy
        let request = transfer.request
        let me = Unmanaged.passUnretained(transfer).toOpaque()
        var ok = true
        func check(_ code: CURLcode) { if code != CURLE_OK { ok = false } }
        check(ccurl_easy_setopt_str(easy, CURLOPT_URL, request.url))
        check(ccurl_easy_setopt_ptr(easy, CURLOPT_PRIVATE, me))
        check(ccurl_easy_setopt_ptr(easy, CURLOPT_ERRORBUFFER, transfer.errorBuffer))
        check(ccurl_easy_setopt_write_function(easy, CURLOPT_WRITEFUNCTION, writeCallback))
        check(ccurl_easy_setopt_ptr(easy, CURLOPT_WRITEDATA, me))
        check(ccurl_easy_setopt_write_function(easy, CURLOPT_HEADERFUNCTION, headerCallback))
        check(ccurl_easy_setopt_ptr(easy, CURLOPT_HEADERDATA, me))
        check(ccurl_easy_setopt_opensocket_function(easy, openSocketCallback))
        check(ccurl_easy_setopt_ptr(easy, CURLOPT_OPENSOCKETDATA, me))
        check(ccurl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        check(ccurl_easy_setopt_str(easy, CURLOPT_PROTOCOLS_STR, "http,https"))
        check(ccurl_easy_setopt_str(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https"))
        check(ccurl_easy_setopt_long(easy, CURLOPT_FOLLOWLOCATION, request.followRedirects ? 1 : 0))
        check(ccurl_easy_setopt_long(easy, CURLOPT_MAXREDIRS, 5))
        check(ccurl_easy_setopt_long(easy, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS))
        // libcurl's defaults, set anyway: there is no way to turn verification off (API.md §9).
        check(ccurl_easy_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1))
        check(ccurl_easy_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2))
        if let roots {
            if let pem = roots.pem {
                check(ccurl_easy_setopt_blob_nocopy(easy, CURLOPT_CAINFO_BLOB, pem.baseAddress, pem.count))
            } else {
                check(ccurl_easy_setopt_str(easy, CURLOPT_CAINFO, roots.caFile))
                if let directory = roots.systemDirectory { check(ccurl_easy_setopt_str(easy, CURLOPT_CAPATH, directory)) }
            }
        }
        check(ccurl_easy_setopt_long(easy, CURLOPT_NETRC, Int(CURL_NETRC_IGNORED.rawValue)))
        proxy.withUnsafeBufferPointer { check(ccurl_easy_setopt_str(easy, CURLOPT_PROXY, $0.baseAddress)) }
        check(ccurl_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, configuration.connectTimeoutMs))
        if let timeoutMs = transfer.timeoutMs { check(ccurl_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, max(1, timeoutMs))) }
        userAgent.withUnsafeBufferPointer { check(ccurl_easy_setopt_str(easy, CURLOPT_USERAGENT, $0.baseAddress)) }
        // "" offers every encoding libcurl decodes, and turns decoding on for any
        // Content-Encoding the upstream sends, asked for or not.
        check(ccurl_easy_setopt_str(easy, CURLOPT_ACCEPT_ENCODING, ""))

        var list: UnsafeMutablePointer<curl_slist>?
        func add(_ line: String) { list = curl_slist_append(list, line) }
        var hasContentType = false
        var hasExpect = false
        for (name, value) in request.headers {
            let lower = name.lowercased()
            if lower == "content-type" { hasContentType = true }
            if lower == "expect" { hasExpect = true }
            // "Name;" is curl's way to send a header with an empty value.
            add(value.isEmpty ? "\(name);" : "\(name): \(value)")
        }
        var payload: [UInt8]?
        switch request.body {
        case .text(let text)?:
            payload = Array(text.utf8)
            // Sent as is: no Content-Type unless the node gives one ("Content-Type:" stops curl adding its form type).
            if !hasContentType { add("Content-Type:") }
        case .json(let value)?:
            payload = value.bytes
            if !hasContentType { add("Content-Type: application/json") }
        case nil:
            break
        }
        if payload != nil, !hasExpect { add("Expect:") }
        transfer.headerList = list
        if let list { check(ccurl_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, list)) }

        if let payload {
            check(ccurl_easy_setopt_int64(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(payload.count)))
            if payload.isEmpty {
                check(ccurl_easy_setopt_str(easy, CURLOPT_COPYPOSTFIELDS, ""))
            } else {
                // COPYPOSTFIELDS copies POSTFIELDSIZE bytes, so the array need not outlive this call.
                payload.withUnsafeBytes { raw in
                    check(ccurl_easy_setopt_ptr(easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: raw.baseAddress)))
                }
            }
            if transfer.method != "POST" { check(ccurl_easy_setopt_str(easy, CURLOPT_CUSTOMREQUEST, transfer.method)) }
        } else {
            switch transfer.method {
            case "GET": break
            case "HEAD": check(ccurl_easy_setopt_long(easy, CURLOPT_NOBODY, 1))
            case "POST":
                check(ccurl_easy_setopt_int64(easy, CURLOPT_POSTFIELDSIZE_LARGE, 0))
                check(ccurl_easy_setopt_str(easy, CURLOPT_COPYPOSTFIELDS, ""))
            default: check(ccurl_easy_setopt_str(easy, CURLOPT_CUSTOMREQUEST, transfer.method))
            }
        }
        guard ok else {
            releaseEasy(transfer)
            complete(transfer, .failure(NodeError(.internal, "\(transfer.method) \(request.url): libcurl refused an option")))
            return
        }
        guard curl_multi_add_handle(multi, easy) == CURLM_OK else {
            releaseEasy(transfer)
            complete(transfer, .failure(NodeError(.internal, "\(transfer.method) \(request.url): curl_multi_add_handle failed")))
            return
        }
        transfer.phase = .running
        running[ObjectIdentifier(transfer)] = transfer
    }

    /// - Parameter reuse: the attempt ended on its own (not aborted): its handle is reset and kept for another.
    private func releaseEasy(_ transfer: Transfer, reuse: Bool = false) {
        if let easy = transfer.easy {
            if case .running = transfer.phase { curl_multi_remove_handle(multi, easy) }
            if reuse, spareHandles.count < FetchLoop.maxSpareHandles {
                curl_easy_reset(easy)
                spareHandles.append(easy)
            } else {
                curl_easy_cleanup(easy)
            }
            transfer.easy = nil
        }
        if let list = transfer.headerList {
            curl_slist_free_all(list)
            transfer.headerList = nil
        }
        running[ObjectIdentifier(transfer)] = nil
    }

    /// Cancellation: removing an unfinished easy handle from the multi makes
    /// libcurl close its connection, so the upstream sees the close at once.
    private func abort(_ transfer: Transfer) {
        switch transfer.phase {
        case .done:
            return
        case .running:
            releaseEasy(transfer)
            transfer.budget?.giveBack(transfer.countedBytes)
            transfer.countedBytes = 0
        case .backoff:
            waiting.removeAll(where: { $0 === transfer })
        case .queued:
            break
        }
        complete(transfer, .failure(NodeError(.cancelled, "\(transfer.method) \(transfer.request.url) cancelled")))
    }

    private func collectFinished() {
        var queued: Int32 = 0
        while let message = curl_multi_info_read(multi, &queued) {
            guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
            let code = message.pointee.data.result
            var user: UnsafeMutableRawPointer?
            ccurl_easy_getinfo_ptr(easy, CURLINFO_PRIVATE, &user)
            guard let user else { continue }
            let transfer = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
            finishAttempt(transfer, code: code, easy: easy)
        }
    }

    private func finishAttempt(_ transfer: Transfer, code: CURLcode, easy: UnsafeMutableRawPointer) {
        var statusCode = 0
        ccurl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &statusCode)
        var urlPointer: UnsafeMutablePointer<CChar>?
        ccurl_easy_getinfo_str(easy, CURLINFO_EFFECTIVE_URL, &urlPointer)
        // The request's own string when it is the same (no redirect, nothing normalized): a job holds one per
        // fetch result, and a copy of each URL was 8 MB of a job of 100,000 fetches.
        let finalURL = urlPointer.map { sent in
            transfer.request.url.withCString { strcmp($0, sent) == 0 } ? transfer.request.url : String(cString: sent)
        } ?? transfer.request.url
        var versionCode = 0
        ccurl_easy_getinfo_long(easy, CURLINFO_HTTP_VERSION, &versionCode)
        if code == CURLE_COULDNT_CONNECT, transfer.socketErrno == 0 {
            // connect() itself failing with EADDRNOTAVAIL means no local port was free.
            var osErrno = 0
            ccurl_easy_getinfo_long(easy, CURLINFO_OS_ERRNO, &osErrno)
            if Int32(truncatingIfNeeded: osErrno) == EADDRNOTAVAIL { transfer.socketErrno = EADDRNOTAVAIL }
        }
        let retryAfterMs = transfer.headers.first(where: { $0.name == "retry-after" }).flatMap { Int($0.value.trimmingSpacesString()) }
            .map { min(max(0, $0), 60) * 1000 }
        releaseEasy(transfer, reuse: true)

        // The words of a failure, made only for one: a transfer that succeeds needs neither.
        var what: String { "\(transfer.method) \(transfer.request.url)" }
        var failure: NodeError
        var retryable = false
        if code == CURLE_OK {
            let elapsed = Int(Timestamp.monotonicMs() - transfer.startedMs)
            let contentType = transfer.headers.first(where: { $0.name == "content-type" })?.value
            let accepted = (200..<300).contains(statusCode) || transfer.request.acceptStatus.contains(statusCode)
            let decoded = BodyDecoder.decode(
                transfer.body, contentType: contentType, expect: accepted ? transfer.request.expect : .auto, strict: accepted)
            var response = FetchResponse(
                status: statusCode, headers: transfer.headers, body: .null, bodyEncoding: "text", rawBody: transfer.body,
                contentType: contentType, bytes: transfer.body.count, elapsedMs: elapsed, url: finalURL)
            response.httpVersion = FetchResponse.httpVersion(curlCode: versionCode)
            // This answer takes the place of an earlier attempt's, whose bytes are no longer held.
            transfer.budget?.giveBack(transfer.lastResponseCounted)
            transfer.lastResponseCounted = transfer.countedBytes
            transfer.countedBytes = 0
            switch decoded {
            case .value(let (value, encoding)):
                response.body = value
                response.bodyEncoding = encoding
            case .invalidJSON(let message):
                response.body = .string(Base64.encode(transfer.body))
                response.bodyEncoding = "base64"
                transfer.lastResponse = response
                complete(transfer, .failure(NodeError(.invalidJSON, "\(what): \(message)")))
                return
            }
            transfer.lastResponse = response
            if accepted {
                complete(transfer, .success(response))
                return
            }
            failure = NodeError(.httpStatus, "\(what) answered \(statusCode)", status: statusCode)
            retryable = statusCode >= 500 || statusCode == 429
        } else {
            // The attempt's partial body is thrown away.
            transfer.budget?.giveBack(transfer.countedBytes)
            transfer.countedBytes = 0
            let detail =
                transfer.errorBuffer[0] != 0 ? String(cString: transfer.errorBuffer) : String(cString: curl_easy_strerror(code))
            (failure, retryable) = classify(code, transfer: transfer, what: what, detail: detail)
        }

        if retryable, transfer.request.idempotent, transfer.attempts <= transfer.request.retries {
            let shift = min(transfer.attempts - 1, 20)
            let base = min(Double(max(0, transfer.request.retryBackoffMs)) * Double(1 << shift), 60_000)
            let jittered = base * Double.random(in: 0.8...1.2, using: &random)
            let delay = failure.kind == .httpStatus ? (retryAfterMs ?? Int(jittered)) : Int(jittered)
            transfer.phase = .backoff(dueMs: Timestamp.monotonicMs() + Int64(delay))
            waiting.append(transfer)
            return
        }
        complete(transfer, .failure(failure))
    }

    private func classify(_ code: CURLcode, transfer: Transfer, what: String, detail: String) -> (NodeError, Bool) {
        if let reason = transfer.tooLargeReason {
            return (NodeError(.tooLarge, "\(what): \(reason)"), transfer.refusedBy == .server)
        }
        if code == CURLE_FILESIZE_EXCEEDED {
            return (NodeError(.tooLarge, "\(what): \(transfer.bodyTooLarge)"), false)
        }
        // libcurl 7.x reports a header line over its 100 KiB buffer as "out of memory".
        if code == CURLE_OUT_OF_MEMORY, !transfer.headersEnded {
            return (NodeError(.tooLarge, "\(what): a response header line is larger than libcurl's 100 KiB limit"), false)
        }
        if let denied = transfer.deniedMessage, code == CURLE_COULDNT_CONNECT {
            return (NodeError(.connect, "\(what): \(denied)"), false)
        }
        if code == CURLE_COULDNT_CONNECT, let exhausted = Transfer.exhaustion(transfer.socketErrno) {
            return (NodeError(.resourceExhausted, "\(what): cannot open a socket: \(exhausted)"), true)
        }
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY:
            return (NodeError(.dns, "\(what): \(detail)"), false)
        case CURLE_OPERATION_TIMEDOUT:
            return (NodeError(.timeout, "\(what) timed out: \(detail)"), true)
        case CURLE_COULDNT_CONNECT, CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE,
            CURLE_HTTP2, CURLE_HTTP2_STREAM, CURLE_WEIRD_SERVER_REPLY, CURLE_HTTP3, CURLE_QUIC_CONNECT_ERROR:
            return (NodeError(.connect, "\(what): \(detail)"), true)
        case CURLE_TOO_MANY_REDIRECTS:
            return (NodeError(.tooManyRedirects, "\(what): too many redirects (more than 5)"), false)
        case CURLE_UNSUPPORTED_PROTOCOL where transfer.status == 0 && detail.contains("HTTP/0.9"):
            // Bytes that are not an HTTP response: a broken upstream, like a reset.
            return (NodeError(.connect, "\(what): the upstream's answer is not HTTP"), true)
        case CURLE_UNSUPPORTED_PROTOCOL:
            return (NodeError(.connect, "\(what): refused protocol (only http and https are allowed): \(detail)"), false)
        case CURLE_URL_MALFORMAT:
            return (NodeError(.connect, "\(what): malformed URL: \(detail)"), false)
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
            CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_ENGINE_INITFAILED,
            CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CRL_BADFILE,
            CURLE_SSL_SHUTDOWN_FAILED, CURLE_USE_SSL_FAILED, CURLE_SSL_CLIENTCERT:
            return (NodeError(.tls, "\(what): \(detail)"), false)
        case CURLE_OUT_OF_MEMORY:
            return (NodeError(.internal, "\(what): \(detail)"), false)
        default:
            return (NodeError(.connect, "\(what): \(detail)"), false)
        }
    }

    private func nextBackoffDue() -> Int64? {
        var next: Int64?
        for transfer in waiting {
            if case .backoff(let due) = transfer.phase { next = min(next ?? due, due) }
        }
        return next
    }

    private func fireDueBackoffs() {
        guard !waiting.isEmpty else { return }
        let now = Timestamp.monotonicMs()
        var due: [Transfer] = []
        waiting.removeAll { transfer in
            if case .backoff(let at) = transfer.phase, at <= now {
                due.append(transfer)
                return true
            }
            return false
        }
        for transfer in due { beginAttempt(transfer) }
    }

    private func complete(_ transfer: Transfer, _ result: Result<FetchResponse, NodeError>) {
        if case .done = transfer.phase { return }
        transfer.phase = .done
        let elapsed: Int
        let outcome: String
        switch result {
        case .success(let response):
            elapsed = response.elapsedMs
            outcome = "succeeded"
        case .failure(let error):
            elapsed = Int(Timestamp.monotonicMs() - transfer.startedMs)
            outcome = error.kind.rawValue
        }
        counters.withLock {
            $0.inFlight -= 1
            $0.record(outcome: outcome, elapsedMs: elapsed)
        }
        let completion = transfer.completion
        transfer.completion = nil
        transfer.onAttempt = nil
        transfer.budget = nil
        var crossedBudget = false
        if case .failure(let error) = result, error.kind == .tooLarge { crossedBudget = transfer.refusedBy != nil }
        let finished = FetchOutcome(
            result: result, attempts: transfer.attempts, lastResponse: transfer.lastResponse, crossedBudget: crossedBudget)
        // The outcome has the bytes now: a handle kept after the end (a job's, a coalesced transfer's) keeps none.
        transfer.lastResponse = nil
        transfer.body = []
        completion?(finished)
    }
}

extension String {
    fileprivate func trimmingSpacesString() -> String { self[...].trimmingSpaces() }
}
