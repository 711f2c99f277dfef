import Foundation
import Threads

/// The private HTTP cache of `cache: "use"` fetches (API.md §9, RFC 9111), kept in the store's SQLite file
/// (table `http_cache`) and bounded in bytes, the least recently used response out first.
///
/// Every call queues its work on the cache's own serial queue and connection, so neither the engine nor an event
/// loop waits for SQLite; answers come back through completions on that queue.
public final class HTTPCache: @unchecked Sendable {
    // @unchecked: `connection`, `totalBytes`, `entries` and `sequence` are touched only on `queue`;
    // the counters read by `/metrics` are behind `counters`' own lock.
    private let queue = DispatchQueue(label: "jobserver.http-cache")
    private let connection: SQLiteConnection
    private let capacityBytes: Int
    private let now: @Sendable () -> Int64
    private var totalBytes = 0
    private var entries = 0
    private var sequence: Int64 = 0
    private let counters = Locked(TransferMetrics())

    /// What a lookup found.
    enum Lookup {
        /// A fresh response: use it, no request.
        case fresh(FetchOutcome)
        /// A stale response with validators: send this conditional request instead.
        case revalidate(FetchRequest)
        /// Nothing usable: send the request as it is.
        case absent
    }

    /// The table, created by the SQLite store's migration 7 or, for a cache kept in memory, at open. One response
    /// per GET URL, the request's values of its Vary fields beside it; `last_used` is a sequence number, the least
    /// recently used goes first.
    static let schema = """
        CREATE TABLE IF NOT EXISTS http_cache (
            key TEXT NOT NULL PRIMARY KEY,
            vary_key TEXT NOT NULL,
            status INTEGER NOT NULL,
            url TEXT NOT NULL,
            http_version TEXT,
            request_time INTEGER NOT NULL,
            response_time INTEGER NOT NULL,
            last_used INTEGER NOT NULL,
            size INTEGER NOT NULL,
            headers TEXT NOT NULL,
            body BLOB NOT NULL
        );
        CREATE INDEX IF NOT EXISTS http_cache_last_used ON http_cache (last_used);
        """

    /// Opens the cache in the SQLite store's file at `path`, which the store has already migrated, or, with `path`
    /// nil, in memory (a store that is not SQLite: the cache is then this server's own and starts empty).
    /// - Parameters:
    ///   - capacityBytes: `--cache-bytes`; a response larger than this is never stored.
    ///   - now: the wall clock in ms since the epoch (tests pass their own).
    /// - Throws: `StoreError` when the file cannot be opened or read.
    public init(path: String?, capacityBytes: Int, now: @escaping @Sendable () -> Int64 = { Timestamp.nowMs() }) throws {
        if let path {
            connection = try SQLiteConnection(path: path, create: false)
        } else {
            connection = try SQLiteConnection(path: ":memory:", create: true)
            try connection.execute(Self.schema)
        }
        self.capacityBytes = max(0, capacityBytes)
        self.now = now
        try connection.execute("PRAGMA journal_mode = WAL")
        // The cache holds copies: a crash may lose its last writes, so they need no fsync each.
        try connection.execute("PRAGMA synchronous = NORMAL")
        let totals = try connection.prepare("SELECT COALESCE(SUM(size), 0), COUNT(*), COALESCE(MAX(last_used), 0) FROM http_cache")
        defer { totals.reset() }
        if try totals.step() {
            totalBytes = totals.int(0)
            entries = totals.int(1)
            sequence = totals.int64(2)
        }
        publishSize()
    }

    /// Counts of outcomes, bytes and entries, for `/metrics`.
    public var metrics: TransferMetrics { counters.withLock { $0 } }

    /// Looks `request` up (a GET with `cache: "use"`).
    func lookup(_ request: FetchRequest, completion: @escaping @Sendable (Lookup) -> Void) {
        queue.async {
            completion(self.find(request))
        }
    }

    /// Takes the outcome of the request a lookup led to: stores what may be stored, turns a `304` into the
    /// stored response, and answers the outcome the node gets, with its `cache` outcome set.
    /// - Parameters:
    ///   - original: the request as the node gave it; `sent`: what was sent (with validators when revalidating).
    func absorb(original: FetchRequest, sent: FetchRequest, requestTimeMs: Int64, outcome: FetchOutcome,
                completion: @escaping @Sendable (FetchOutcome) -> Void) {
        queue.async {
            completion(self.take(original: original, sent: sent, requestTimeMs: requestTimeMs, outcome: outcome))
        }
    }

    /// Waits until the queued work is done (tests and shutdown only).
    func drain() { queue.sync {} }

    // MARK: - On `queue`

    private struct Entry {
        var status: Int
        var url: String
        var httpVersion: String?
        var requestTimeMs: Int64
        var responseTimeMs: Int64
        var headers: [(name: String, value: String)]
        var body: [UInt8]
    }

    /// `GET <url>`, plus the request's `Authorization` and `Cookie` values: jobs of different clients share this
    /// cache, so a response fetched with one set of credentials is never handed to a request with others.
    static func key(_ request: FetchRequest) -> String {
        var key = "GET " + request.url
        for name in ["authorization", "cookie"] {
            if let value = HTTPCachePolicy.field(name, request.headers) { key += "\n\(name): \(value)" }
        }
        return key
    }

    private func load(_ request: FetchRequest) -> Entry? {
        do {
            let select = try connection.prepare(
                "SELECT vary_key, status, url, http_version, request_time, response_time, headers, body FROM http_cache WHERE key = ?")
            defer { select.reset() }
            select.bind(1, HTTPCache.key(request))
            guard try select.step() else { return nil }
            let headers = HTTPCache.headers(from: try select.json(6, maxDepth: 4))
            let varyKey = select.string(0) ?? ""
            guard varyKey == HTTPCachePolicy.varyKey(responseHeaders: headers, requestHeaders: request.headers) else { return nil }
            return Entry(status: select.int(1), url: select.string(2) ?? request.url, httpVersion: select.string(3),
                         requestTimeMs: select.int64(4), responseTimeMs: select.int64(5), headers: headers,
                         body: select.blob(7) ?? [])
        } catch {
            return nil
        }
    }

    private func find(_ request: FetchRequest) -> Lookup {
        let requestDirectives = HTTPCachePolicy.directives(HTTPCachePolicy.field("cache-control", request.headers))
        guard requestDirectives["no-store"] == nil, let entry = load(request) else { return .absent }
        if HTTPCachePolicy.isFresh(responseHeaders: entry.headers, requestHeaders: request.headers,
                                   requestTimeMs: entry.requestTimeMs, responseTimeMs: entry.responseTimeMs, nowMs: now()) {
            touch(request)
            count("hit")
            return .fresh(outcome(entry, request, elapsedMs: 0, cache: "hit"))
        }
        let validators = HTTPCachePolicy.validators(entry.headers)
        guard !validators.isEmpty else { return .absent }
        var conditional = request
        let names = Set(validators.map { $0.name.lowercased() })
        conditional.headers.removeAll { names.contains($0.name.lowercased()) }
        conditional.headers += validators
        conditional.acceptStatus.insert(304)
        // An empty 304 must not fail `expect: json`: the body is read as the node asks once the answer is known.
        conditional.expect = .bytes
        return .revalidate(conditional)
    }

    private func take(original: FetchRequest, sent: FetchRequest, requestTimeMs: Int64, outcome: FetchOutcome) -> FetchOutcome {
        guard case .success(let response) = outcome.result else {
            count("miss")
            return outcome.withCache("miss")
        }
        if response.status == 304, sent.headers.contains(where: { $0.name == "If-None-Match" || $0.name == "If-Modified-Since" }),
            var entry = load(original)
        {
            entry.headers = HTTPCachePolicy.updated(entry.headers, with: response.headers)
            entry.requestTimeMs = requestTimeMs
            entry.responseTimeMs = now()
            if HTTPCachePolicy.refusal(status: entry.status, requestHeaders: original.headers, responseHeaders: entry.headers) == nil {
                store(original, entry)
            } else {
                remove(original)
            }
            count("revalidated")
            return self.outcome(entry, original, elapsedMs: response.elapsedMs, cache: "revalidated", attempts: outcome.attempts)
        }
        if HTTPCachePolicy.refusal(status: response.status, requestHeaders: original.headers, responseHeaders: response.headers) == nil {
            store(original, Entry(status: response.status, url: response.url, httpVersion: response.httpVersion,
                                  requestTimeMs: requestTimeMs, responseTimeMs: now(), headers: response.headers,
                                  body: response.rawBody))
        } else if HTTPCachePolicy.directives(response.header("cache-control"))["no-store"] != nil {
            remove(original)
        }
        count("miss")
        if sent.expect != original.expect || sent.acceptStatus != original.acceptStatus {
            // A conditional request answered in full: read it as the node's own request would have.
            let entry = Entry(status: response.status, url: response.url, httpVersion: response.httpVersion,
                              requestTimeMs: requestTimeMs, responseTimeMs: 0, headers: response.headers, body: response.rawBody)
            guard (200..<300).contains(response.status) || original.acceptStatus.contains(response.status) else {
                var failed = outcome.withCache("miss")
                failed.result = .failure(NodeError(.httpStatus, "GET \(original.url) answered \(response.status)", status: response.status))
                return failed
            }
            return self.outcome(entry, original, elapsedMs: response.elapsedMs, cache: "miss", attempts: outcome.attempts)
        }
        return outcome.withCache("miss")
    }

    /// The outcome a node gets from a stored response, read as its request's `expect` asks.
    private func outcome(_ entry: Entry, _ request: FetchRequest, elapsedMs: Int, cache: String, attempts: Int = 0) -> FetchOutcome {
        let contentType = HTTPCachePolicy.field("content-type", entry.headers)
        var response = FetchResponse(
            status: entry.status, headers: entry.headers, body: .null, bodyEncoding: "text", rawBody: entry.body,
            contentType: contentType, bytes: entry.body.count, elapsedMs: elapsedMs, url: entry.url)
        response.httpVersion = entry.httpVersion
        response.cacheOutcome = cache
        switch BodyDecoder.decode(entry.body, contentType: contentType, expect: request.expect) {
        case .value(let (value, encoding)):
            response.body = value
            response.bodyEncoding = encoding
            return FetchOutcome(result: .success(response), attempts: attempts, lastResponse: response)
        case .invalidJSON(let message):
            response.body = .string(Base64.encode(entry.body))
            response.bodyEncoding = "base64"
            return FetchOutcome(result: .failure(NodeError(.invalidJSON, "GET \(request.url): \(message)")),
                                attempts: attempts, lastResponse: response)
        }
    }

    private func store(_ request: FetchRequest, _ entry: Entry) {
        let headersJSON = JSONValue.array(entry.headers.map { .array([.string($0.name), .string($0.value)]) })
        let size = entry.body.count + headersJSON.bytes.count + entry.url.utf8.count + 64
        // One transaction for the old row, the evictions and the new row.
        guard (try? connection.execute("BEGIN IMMEDIATE")) != nil else { return }
        defer {
            if connection.inTransaction, (try? connection.execute("COMMIT")) == nil { try? connection.execute("ROLLBACK") }
            publishSize()
        }
        remove(request)
        guard size <= capacityBytes else { return }
        do {
            try evict(toFit: size)
            sequence += 1
            let insert = try connection.prepare("""
                INSERT OR REPLACE INTO http_cache
                    (key, vary_key, status, url, http_version, request_time, response_time, last_used, size, headers, body)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """)
            defer { insert.reset() }
            insert.bind(1, HTTPCache.key(request))
            insert.bind(2, HTTPCachePolicy.varyKey(responseHeaders: entry.headers, requestHeaders: request.headers))
            insert.bind(3, entry.status)
            insert.bind(4, entry.url)
            insert.bind(5, entry.httpVersion)
            insert.bind(6, entry.requestTimeMs)
            insert.bind(7, entry.responseTimeMs)
            insert.bind(8, sequence)
            insert.bind(9, size)
            insert.bind(10, json: headersJSON)
            insert.bind(11, blob: entry.body)
            try insert.run()
            totalBytes += size
            entries += 1
        } catch {
            // Not stored: the next fetch is a miss, nothing worse.
        }
    }

    /// Deletes least recently used responses until `size` more bytes fit.
    private func evict(toFit size: Int) throws {
        while totalBytes + size > capacityBytes, entries > 0 {
            let oldest = try connection.prepare("SELECT key, size FROM http_cache ORDER BY last_used LIMIT 64")
            var victims: [(String, Int)] = []
            while try oldest.step() {
                victims.append((oldest.string(0) ?? "", oldest.int(1)))
            }
            oldest.reset()
            guard !victims.isEmpty else {
                totalBytes = 0
                entries = 0
                return
            }
            for (key, bytes) in victims {
                guard totalBytes + size > capacityBytes else { break }
                let delete = try connection.prepare("DELETE FROM http_cache WHERE key = ?")
                delete.bind(1, key)
                try delete.run()
                delete.reset()
                totalBytes -= bytes
                entries -= 1
            }
        }
    }

    private func remove(_ request: FetchRequest) {
        do {
            let existing = try connection.prepare("SELECT size FROM http_cache WHERE key = ?")
            existing.bind(1, HTTPCache.key(request))
            let size = try existing.step() ? existing.int(0) : nil
            existing.reset()
            guard let size else { return }
            let delete = try connection.prepare("DELETE FROM http_cache WHERE key = ?")
            delete.bind(1, HTTPCache.key(request))
            try delete.run()
            delete.reset()
            totalBytes -= size
            entries -= 1
        } catch {}
        publishSize()
    }

    private func touch(_ request: FetchRequest) {
        sequence += 1
        do {
            let update = try connection.prepare("UPDATE http_cache SET last_used = ? WHERE key = ?")
            update.bind(1, sequence)
            update.bind(2, HTTPCache.key(request))
            try update.run()
            update.reset()
        } catch {}
    }

    private func count(_ outcome: String) {
        counters.withLock { $0.cacheOutcomes[outcome, default: 0] += 1 }
    }

    private func publishSize() {
        let (bytes, count) = (totalBytes, entries)
        counters.withLock {
            $0.cacheBytes = bytes
            $0.cacheEntries = count
        }
    }

    private static func headers(from json: JSONValue?) -> [(name: String, value: String)] {
        (json?.arrayValue ?? []).compactMap { pair in
            guard let items = pair.arrayValue, items.count == 2, let name = items[0].stringValue,
                let value = items[1].stringValue else { return nil }
            return (name, value)
        }
    }
}

extension FetchOutcome {
    /// The outcome with its response's `cache` outcome set.
    func withCache(_ cache: String) -> FetchOutcome {
        var copy = self
        if case .success(var response) = copy.result {
            response.cacheOutcome = cache
            copy.result = .success(response)
        }
        copy.lastResponse?.cacheOutcome = cache
        return copy
    }
}
