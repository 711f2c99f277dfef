// A fetch with `paginate` (API.md §7.2): its pages are fetched one after another in the one fetch-queue slot the
// node was given, which it holds until the last page is done, so a paginated fetch counts once against
// `--max-concurrent-fetches` and `--max-per-host` like any fetch. Each page is a `Fetcher.start` of its own, with
// the node's retries and the deny list checked on the address it connects to; `timeout_ms` and cancellation reach
// the page in flight through `transfers`, as for a plain fetch.

/// One paginated fetch in progress: what its pages so far gave. Lives in `JobRun.runners` while the node runs.
/// Like the run, it is read and changed only on the engine's queue: a page's completion carries it there.
final class PageWalk: @unchecked Sendable {
    // @unchecked: see above; the fetcher's completion holds it without touching it, and hands it back to `queue`.
    let spec: PaginateSpec
    /// The first page's request; later pages differ only in `url` and `maxBytes`.
    let first: FetchRequest
    let firstOrigin: String?
    /// The fetch-queue slot's host, given back when the walk ends.
    let host: String
    /// What `max_bytes` (or the server's limit) allows all pages together.
    let budget: Int
    var pages = 0
    /// Attempts of the pages that finished.
    var attempts = 0
    var bytes = 0
    var items: [JSONValue] = []
    var results: [JSONValue] = []
    var last: FetchResponse?

    init(spec: PaginateSpec, first: FetchRequest, host: String, budget: Int) {
        self.spec = spec
        self.first = first
        self.firstOrigin = PageURLs.origin(first.url)
        self.host = host
        self.budget = budget
    }

    /// The first page's request: a `page` walk sets its parameter to `start` on the written URL.
    static func firstRequest(_ request: FetchRequest, _ spec: PaginateSpec) -> FetchRequest {
        guard case .page(let param, let start) = spec.next else { return request }
        var first = request
        first.url = PageURLs.settingQuery(request.url, name: param, value: String(start))
        return first
    }

    /// The node's result once paging stopped (API.md §7.2), fields in the documented order.
    func result(truncated: Bool) -> JSONValue {
        if spec.items != nil {
            var last: JSONValue = .null
            if let response = self.last {
                last = .object([
                    JSONMember("status", .int(response.status)),
                    JSONMember("headers", .object(response.headers.map { JSONMember($0.name, .string($0.value)) })),
                    JSONMember("url", .string(response.url)),
                ])
            }
            return .object([
                JSONMember("items", .array(items)), JSONMember("pages", .int(pages)),
                JSONMember("truncated", .bool(truncated)), JSONMember("last", last),
            ])
        }
        return .object([
            JSONMember("pages", .int(pages)), JSONMember("truncated", .bool(truncated)),
            JSONMember("results", .array(results)),
        ])
    }

    /// Where the page after `response` (whose result is `page`) is: `nil` when there is none.
    func nextURL(after response: FetchResponse, page: JSONValue) -> Result<String?, NodeError> {
        let what = "\(first.method) \(response.url)"
        switch spec.next {
        case .link:
            guard let field = response.header("link"), let target = PageURLs.nextLink(field), !target.isEmpty else {
                return .success(nil)
            }
            guard let url = PageURLs.resolve(target, against: response.url) else {
                return .failure(NodeError(.invalidURL, "\(what): the Link header's next target \"\(target)\" is not a URL"))
            }
            return .success(url)
        case .url(let path):
            guard case .success(let value) = page.value(at: path.tokens[...], fullTokens: path.tokens) else {
                return .success(nil)
            }
            switch value {
            case .null, .string(""):
                return .success(nil)
            case .string(let target):
                guard let url = PageURLs.resolve(target, against: response.url) else {
                    return .failure(NodeError(.invalidURL, "\(what): the next URL \"\(target)\" at \(path.text) is not a URL"))
                }
                return .success(url)
            default:
                return .failure(
                    NodeError(.refType, "\(what): the next URL at \(path.text) is \(article(value)), not a string"))
            }
        case .cursor(let path, let param):
            guard case .success(let value) = page.value(at: path.tokens[...], fullTokens: path.tokens) else {
                return .success(nil)
            }
            let text: String
            switch value {
            case .null, .string(""): return .success(nil)
            case .string(let s): text = s
            case .number(let n): text = n
            case .bool(let b): text = b ? "true" : "false"
            default:
                return .failure(
                    NodeError(
                        .refType, "\(what): the cursor at \(path.text) is \(article(value)), not a string, number or boolean"))
            }
            return .success(PageURLs.settingQuery(first.url, name: param, value: text))
        case .page(let param, let start):
            return .success(PageURLs.settingQuery(first.url, name: param, value: String(start + pages)))
        }
    }

    /// Why `url` may not be fetched as the next page, or `nil`.
    func refusal(of url: String) -> NodeError? {
        let what = "\(first.method) \(first.url)"
        if let problem = URLCheck.problem(url, maxBytes: Limits.maxURLBytes) {
            return NodeError(.invalidURL, "\(what): the URL of page \(pages + 1), \(url), \(problem)")
        }
        guard spec.sameOrigin else { return nil }
        let origin = PageURLs.origin(url)
        if origin == nil || origin != firstOrigin {
            return NodeError(
                .crossOrigin,
                "\(what): the URL of page \(pages + 1), \(url), is on origin \(origin ?? "(none)"), not the first "
                    + "page's \(firstOrigin ?? "(none)"); set \"same_origin\": false to follow it")
        }
        return nil
    }
}

extension JobRun {
    /// Starts paging node `i` with its first request, in the fetch-queue slot given for `host`.
    func beginPaging(_ i: Int, _ request: FetchRequest, _ spec: PaginateSpec, host: String) {
        let budget = request.maxBytes ?? engine.configuration.limits.maxResponseBytes
        let walk = PageWalk(spec: spec, first: request, host: host, budget: budget)
        runners[i] = walk
        // Paging starts from the first page, after a restart too.
        nodes[i].pages = 0
        fetchPage(i, walk, url: request.url)
    }

    private func fetchPage(_ i: Int, _ walk: PageWalk, url: String) {
        var request = walk.first
        request.url = url
        request.maxBytes = max(0, walk.budget - walk.bytes)
        let prior = (priorAttempts[i] ?? 0) + walk.attempts
        let engine = self.engine
        let host = walk.host
        transfers[i] = engine.fetcher.start(
            request,
            timeoutMs: nil,
            budget: byteBudget,
            onAttempt: { [weak self] attempt in
                guard let run = self else { return }
                engine.queue.async { run.pageAttemptStarted(i, attempt: prior + attempt) }
            },
            completion: { [weak self] outcome in
                let run = self
                // The slot is given back once no page follows.
                engine.fetchEnded(slotOf: nil) {
                    if run?.pageFinished(i, walk, outcome) != true { engine.fetchFinished(host: host) }
                }
            })
    }

    private func pageAttemptStarted(_ i: Int, attempt: Int) {
        guard !stopping, !nodes[i].state.isSettled, nodes[i].attempts != attempt else { return }
        nodes[i].attempts = attempt
        touch(i)
    }

    /// Takes one page's outcome; true when the next page was started.
    private func pageFinished(_ i: Int, _ walk: PageWalk, _ outcome: FetchOutcome) -> Bool {
        transfers[i] = nil
        guard !stopping, let d = deferreds[i], !d.isCalled, runners[i] === walk else { return false }
        walk.attempts += outcome.attempts
        nodes[i].attempts = (priorAttempts[i] ?? 0) + walk.attempts
        if let response = outcome.lastResponse { nodes[i].status = response.status }
        func end(_ result: Result<JSONValue, NodeError>) -> Bool {
            if let response = outcome.lastResponse ?? walk.last {
                pendingBodies.append(
                    (id, graph.nodes[i].id, StoredBody(contentType: response.contentType, bytes: response.rawBody)))
            }
            switch result {
            case .success(let value):
                _ = try? d.takeResult(value)
            case .failure(var error):
                error.node = graph.nodes[i].id
                _ = try? d.takeError(error)
            }
            return false
        }
        let response: FetchResponse
        switch outcome.result {
        case .failure(var error):
            if error.kind == .tooLarge, walk.pages > 0, !outcome.crossedBudget {
                error.message = "\(walk.first.method) \(walk.first.url): page \(walk.pages + 1) takes the pages over "
                    + "\(walk.budget) bytes together (max_bytes bounds the sum of all pages; \(walk.bytes) bytes before it)"
            }
            return end(.failure(error))
        case .success(let answer):
            response = answer
        }
        walk.bytes += response.bytes
        walk.pages += 1
        walk.last = response
        nodes[i].pages = walk.pages
        touch(i)
        let page = response.json
        var empty = false
        if let path = walk.spec.items {
            switch page.value(at: path.tokens[...], fullTokens: path.tokens) {
            case .success(.array(let list)):
                walk.items.append(contentsOf: list)
                empty = list.isEmpty
            case .success(let other):
                return end(
                    .failure(
                        NodeError(
                            .refType,
                            "\(walk.first.method) \(response.url): items \"\(path.text)\" of page \(walk.pages) is "
                                + "\(article(other)), not an array")))
            case .failure(let miss):
                return end(
                    .failure(
                        NodeError(
                            .refUnresolved,
                            "\(walk.first.method) \(response.url): items \"\(path.text)\" found nothing in page "
                                + "\(walk.pages) (\(miss.reason))")))
            }
        } else {
            walk.results.append(page)
        }
        if empty { return end(.success(walk.result(truncated: false))) }
        switch walk.nextURL(after: response, page: page) {
        case .failure(let error):
            return end(.failure(error))
        case .success(nil):
            return end(.success(walk.result(truncated: false)))
        case .success(let url?):
            if walk.pages >= walk.spec.maxPages { return end(.success(walk.result(truncated: true))) }
            if let refusal = walk.refusal(of: url) { return end(.failure(refusal)) }
            fetchPage(i, walk, url: url)
            return true
        }
    }
}
