import Foundation
import HTTPServer
import JobCore
import Synchronization
import Threads

/// The routes of API.md §2.
enum Route: CaseIterable {
    case submitJob, listJobs, getJob, deleteJob, cancelJob, listNodes, getNode, getNodeBody, health, metrics, openAPI
    case retryJob
    case jobEvents

    var method: String {
        switch self {
        case .submitJob, .cancelJob, .retryJob: return "POST"
        case .deleteJob: return "DELETE"
        default: return "GET"
        }
    }

    var pattern: String {
        switch self {
        case .submitJob, .listJobs: return "/v1/jobs"
        case .getJob, .deleteJob: return "/v1/jobs/{id}"
        case .cancelJob: return "/v1/jobs/{id}/cancel"
        case .retryJob: return "/v1/jobs/{id}/retry"
        case .listNodes: return "/v1/jobs/{id}/nodes"
        case .getNode: return "/v1/jobs/{id}/nodes/{node}"
        case .getNodeBody: return "/v1/jobs/{id}/nodes/{node}/body"
        case .jobEvents: return "/v1/jobs/{id}/events"
        case .health: return "/healthz"
        case .metrics: return "/metrics"
        case .openAPI: return "/openapi.yaml"
        }
    }
}

/// The jobserver HTTP API over an `Engine`: routes, JSON in and out, errors of API.md §3.
///
/// Handlers run on event-loop threads and never block there, nor anywhere else: reads of jobs and nodes, listings,
/// body reads, deletes, cancels and `/metrics` ask the engine, which answers through a completion (store reads and
/// large answers on its read queues, a delete once its commit is done); a submission is parsed on
/// `submissionQueues` and answered once its job is committed and taken in; a long-poll holds no thread at all.
final class App: @unchecked Sendable {
    // @unchecked: `shuttingDown` is read and written only with `shutdownLock` held; `webhooks` is set once by
    // `Service` before the server starts (thread start orders it before every handler); the rest is immutable
    // or Sendable (`submissionQueueTurn` is an Atomic, the queues are Dispatch's).
    private let engine: Engine
    private let fetcher: Fetcher
    private let config: ServerConfig
    /// Where large node lists are written (`ServerConfig.answerSpool`).
    private let spool: AnswerSpool
    private let logger: Logger
    private let auth: BearerAuth?
    /// Serial queues, each with a thread of its own while it has work: a submission (up to 1 MiB) is parsed and
    /// validated here, off the event loops, and answered once its job is committed, holding no thread meanwhile.
    private let submissionQueues = (0..<submissionQueueCount).map { DispatchQueue(label: "jobserver.submit.\($0)") }
    private static let submissionQueueCount = 32
    /// Where refusals for a full queue wait out `fullRefusalDelayMs`.
    private let refusals = DispatchQueue(label: "jobserver.refusals")
    private let submissionQueueTurn = Atomic<Int>(0)
    /// Submissions between their turn on a submission queue and the commit of their job: at most as many as there are
    /// queues; the rest wait in arrival order, holding no thread. This is the submissions' backpressure: the store's
    /// writer runs ten nice steps down, so when the CPU is short its commits slow, and so do the submissions that wait
    /// for them, rather than accepting jobs faster than their fetches run. Without it, 60 s of wrk left a backlog of up
    /// to 9,969 accepted jobs (the `--max-active-jobs` refusals then bound it) against at most 407.
    ///
    /// They are weighed by their bodies, too: a submission in flight holds its parsed body, its graph and its node
    /// records, about ten times its bytes, until its job is committed; twenty bodies of 10,000 fetches posted at
    /// once had all been parsed before the first job was taken in (240–280 MiB within the first two seconds).
    /// Bodies of `submissionBytesInFlight` in all (one of the default `--max-request-bytes`) are taken on at once; a
    /// larger one goes alone. In probes of those twenty, 1 MiB peaked at 225–235 MiB against 250–252 with 2 MiB.
    /// Jobs of ten fetches weigh a kilobyte each, so the count bounds them first.
    private let submissions = Admission(limit: submissionQueueCount, weightLimit: submissionBytesInFlight)
    static let submissionBytesInFlight = 1 << 20
    private let shutdownLock = Lock()
    private var shuttingDown = false

    /// The open event streams of `GET /v1/jobs/{id}/events`.
    let eventStreams: EventStreams
    /// The webhook deliveries, for `/metrics`; set once by `Service` before the server starts.
    var webhooks: WebhookOutbox?

    /// `jobserver_http_requests_total`, fed by `makeServerConfiguration()`'s `onResponse`.
    let httpRequests = HTTPRequestCounter()

    init(engine: Engine, fetcher: Fetcher, config: ServerConfig, logger: Logger) {
        self.engine = engine
        self.fetcher = fetcher
        self.config = config
        self.spool = config.answerSpool
        self.logger = logger
        self.auth = config.token.map(BearerAuth.init(token:))
        self.eventStreams = EventStreams(engine: engine, logger: logger, keepAliveIntervalMs: config.eventsKeepAliveMs)
    }

    // MARK: Wiring

    /// A router with every route of API.md §2.
    func makeRouter() -> Router {
        let router = Router()
        for route in Route.allCases {
            router.add(route.method, route.pattern) { [self] httpRequest, responder in
                let request = APIRequest(httpRequest)
                let exchange = Exchange(
                    request: request, logger: logger, deliver: { responder.send($0) },
                    registerOnClose: { responder.onClose = $0 },
                    startStream: { responder.startStream($0, maxBufferedBytes: $1) })
                handle(route, request, exchange)
            }
        }
        // The dashboard's files (no job data in them; the page asks for the token itself).
        UIRoutes.add(to: router, logger: logger)
        // Without the token, an unknown route or method is a 401 too: nothing about the API shows before auth.
        router.unmatched = { [self] request, responder, response in
            responder.send(unauthorized(path: request.path, headers: request.headers) ?? response)
        }
        return router
    }

    /// The `401` for a request without the configured token; `nil` when it may pass (`/healthz` always may).
    private func unauthorized(path: String, headers: HTTPHeaders) -> HTTPResponse? {
        guard let auth, path != Route.health.pattern, !auth.allows(headers["Authorization"]) else { return nil }
        var response = Self.error(401, "unauthorized", "this server needs Authorization: Bearer <token>")
        response.headers.set("WWW-Authenticate", "Bearer")
        return response
    }

    /// The server settings of `config`, with the hook that counts (and, for requests that
    /// reached no route, logs) every response.
    func makeServerConfiguration() -> HTTPServerConfiguration {
        var configuration = config.httpConfiguration
        let counter = httpRequests
        let logger = logger
        configuration.onResponse = { route, method, status, nanoseconds in
            counter.record(route: route, method: method, status: status)
            // Answers the router or the protocol layer gave without a handler (404, 405,
            // 400, 413, 431…); a handler's answers are logged by its `Exchange`.
            if route == nil || status == 405 {
                logger.info(
                    "request",
                    [
                        "method": .string(method), "route": route.map(JSONValue.string) ?? .null, "status": .int(status),
                        "duration_ms": .int(Int(nanoseconds / 1_000_000)),
                    ])
            }
        }
        return configuration
    }

    /// From now on `/healthz` answers 503 and no job is accepted.
    func beginShutdown() {
        shutdownLock.lock()
        shuttingDown = true
        shutdownLock.unlock()
    }

    var isShuttingDown: Bool {
        shutdownLock.lock()
        defer { shutdownLock.unlock() }
        return shuttingDown
    }

    // MARK: Routes

    /// Answers one request on `route`; every path through here sends exactly one response.
    func handle(_ route: Route, _ request: APIRequest, _ exchange: Exchange) {
        if let refusal = unauthorized(path: request.path, headers: request.headers) {
            exchange.send(refusal)
            return
        }
        if route == .submitJob {
            submissions.enter(weight: request.body.count) { [self] release in
                nextSubmissionQueue().async { self.answer(route, request, exchange, release: release) }
            }
        } else {
            answer(route, request, exchange)
        }
    }

    private func nextSubmissionQueue() -> DispatchQueue {
        let turn = submissionQueueTurn.wrappingAdd(1, ordering: .relaxed).newValue & Int.max
        return submissionQueues[turn % submissionQueues.count]
    }

    /// `release`: a submission's place among `submissions`.
    private func answer(_ route: Route, _ request: APIRequest, _ exchange: Exchange, release: Admission.Release? = nil) {
        do {
            switch route {
            case .submitJob: try submitJob(request, exchange, release: release)
            case .listJobs: try listJobs(request, exchange)
            case .getJob: try getJob(request, exchange)
            case .deleteJob: deleteJob(request, exchange)
            case .cancelJob: cancelJob(request, exchange)
            case .retryJob: retryJob(request, exchange)
            case .listNodes: try listNodes(request, exchange)
            case .getNode: try getNode(request, exchange)
            case .getNodeBody: getNodeBody(request, exchange)
            case .jobEvents: try eventStreams.serve(request, exchange)
            case .health: health(exchange)
            case .metrics: metrics(exchange)
            case .openAPI:
                exchange.send(
                    HTTPResponse(
                        status: 200, headers: HTTPHeaders([("Content-Type", "application/yaml")]),
                        body: Array(openAPISpec.utf8)))
            }
        } catch let error as QueryError {
            exchange.send(Self.error(400, "bad_request", error.message))
        } catch {
            exchange.send(internalError(error, exchange))
        }
    }

    /// Answers a submission and gives back its place among `submissions`: once it is refused, or once its job is
    /// committed and taken in.
    private func submitJob(_ request: APIRequest, _ exchange: Exchange, release: Admission.Release?) throws {
        var handedOn = false
        defer { if !handedOn { release?() } }
        if isShuttingDown {
            exchange.send(Self.error(503, "shutting_down", "the server is shutting down; submit again later"))
            return
        }
        let keys = request.headers.values("Idempotency-Key")
        guard keys.count <= 1 else {
            exchange.send(Self.error(400, "bad_request", "Idempotency-Key is given more than once"))
            return
        }
        let key = keys.first
        if let key, !(1...200).contains(key.count) {
            exchange.send(Self.error(400, "bad_request", "Idempotency-Key must be 1 to 200 characters"))
            return
        }
        if let problem = Self.mediaTypeProblem(request.headers["Content-Type"]) {
            exchange.send(Self.error(415, "unsupported_media_type", problem))
            return
        }
        guard !request.body.isEmpty else {
            exchange.send(Self.error(400, "malformed_json", "the request body is empty; expected a JSON job"))
            return
        }
        if engine.refusesActiveJobs, !Self.mayWaitForItsTime(request.body) {
            refuseAsFull(exchange)
            return
        }
        let body: JSONValue
        do {
            body = try JSONValue.parse(request.body, maxDepth: config.graphLimits.requestJSONDepth)
        } catch let error as JSONParseError {
            if error.isTooDeep {
                exchange.send(Self.invalidGraph([(pointer: error.pointer, message: error.message)]))
            } else {
                exchange.send(Self.error(400, "malformed_json", "the request body is not JSON: \(error.description)"))
            }
            return
        }
        let spec: JobSpec
        do {
            spec = try JobSpec.parse(body, limits: config.graphLimits)
        } catch let error as ValidationError {
            exchange.send(Self.invalidGraph(error.issues.map { (pointer: $0.pointer, message: $0.message) }))
            return
        }
        // Answered once the job is committed and taken in: this thread is free meanwhile.
        handedOn = true
        engine.submit(spec, request: body, idempotencyKey: key, requestBytes: request.body) { [self] result in
            release?()
            answerSubmission(result, exchange)
        }
    }

    private func answerSubmission(_ result: Result<SubmitOutcome, Error>, _ exchange: Exchange) {
        switch result {
        case .success(.created(let job)):
            var response = Self.json(201, Presentation.job(job))
            response.headers.set("Location", "/v1/jobs/\(job.id)")
            exchange.send(response)
        case .success(.existing(let job)):
            var response = Self.json(200, Presentation.job(job))
            response.headers.set("Location", "/v1/jobs/\(job.id)")
            exchange.send(response)
        case .success(.conflict(let job)):
            exchange.send(
                Self.error(409, "conflict", "Idempotency-Key was already used for job \(job.id) with a different request body"))
        case .success(.queueFull):
            refuseAsFull(exchange)
        case .success(.shuttingDown):
            exchange.send(Self.error(503, "shutting_down", "the server is shutting down; submit again later"))
        case .failure(let error):
            exchange.send(internalError(error, exchange))
        }
    }

    /// How long a `429 too_many_jobs` is held before it is sent. A client that submits again at once, whatever
    /// `Retry-After` says, can then cost at most one refusal per connection per delay, instead of taking from the
    /// jobs that fill the queue the CPU of as many refusals as it can send (wrk over 32 connections: 13,000 a
    /// second, which cut the jobs succeeding per second by about two fifths).
    static let fullRefusalDelayMs = 50

    private func refuseAsFull(_ exchange: Exchange) {
        refusals.asyncAfter(deadline: .now() + .milliseconds(Self.fullRefusalDelayMs)) { exchange.send(Self.queueFull) }
    }

    private static var queueFull: HTTPResponse {
        var response = error(429, "too_many_jobs", "too many pending and running jobs; retry later")
        response.headers.set("Retry-After", "1")
        return response
    }

    /// Whether a body may hold a `not_before` (a job that waits in the store, which `--max-active-jobs` does not
    /// count): it has the key's bytes, or a backslash that could spell them as escapes. A body with neither
    /// cannot, so a submission over the limit is refused without parsing it.
    static func mayWaitForItsTime(_ body: [UInt8]) -> Bool {
        let key = Array("not_before".utf8)
        return body.withUnsafeBufferPointer { bytes in
            guard let base = bytes.baseAddress else { return false }
            if memchr(base, 0x5C, bytes.count) != nil { return true }
            var from = 0
            while bytes.count - from >= key.count {
                guard let hit = memchr(base + from, Int32(key[0]), bytes.count - from - key.count + 1) else { return false }
                let at = base.distance(to: hit.assumingMemoryBound(to: UInt8.self))
                if memcmp(base + at, key, key.count) == 0 { return true }
                from = at + 1
            }
            return false
        }
    }

    private func listJobs(_ request: APIRequest, _ exchange: Exchange) throws {
        let query = try QueryParameters.jobList(request.queryItems)
        engine.list(state: query.state, limit: query.limit, cursor: query.cursor) { [self] result in
            switch result {
            case .success(let page):
                exchange.send(Self.json(200, Presentation.jobList(page.jobs, nextCursor: page.nextCursor)))
            case .failure(let error) where Self.isBadCursor(error):
                exchange.send(Self.error(400, "bad_request", "cursor is not one this server gave out"))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    private func getJob(_ request: APIRequest, _ exchange: Exchange) throws {
        let query = try QueryParameters.jobWait(request.queryItems)
        let id = request.pathParameters["id"] ?? ""
        let ifNoneMatch = request.headers["If-None-Match"]
        guard let wait = query.waitSeconds, wait > 0, !isShuttingDown else {
            let known = ifNoneMatch.map { header in
                { @Sendable (version: Int64) in Self.ifNoneMatch(header, matches: Self.etag(id: id, version: version)) }
            }
            engine.readJob(id: id, known: known) { [self] result in
                switch result {
                case .success(let read):
                    exchange.send(Self.jobAnswer(read, id: id, ifNoneMatch: ifNoneMatch))
                case .failure(let error):
                    exchange.send(internalError(error, exchange))
                }
            }
            return
        }
        let token = engine.waitForAnswer(id: id, afterVersion: query.sinceVersion, timeoutMs: wait * 1000) { read in
            exchange.send(Self.jobAnswer(read, id: id, ifNoneMatch: ifNoneMatch))
        }
        let box = CancellableBox(token)
        exchange.onClose { box.cancel() }
    }

    /// The answer to a read of job `id` that found `read`.
    static func jobAnswer(_ read: JobRead, id: String, ifNoneMatch: String?) -> HTTPResponse {
        switch read {
        case .settled(let settled):
            var answer = jobAnswer(id: settled.id, version: settled.version, ifNoneMatch: ifNoneMatch) { settled.body }
            // Readers of a job too large to cache share this copy (or file) meanwhile.
            attach(settled.answer, to: &answer)
            return answer
        case .record(let job):
            return jobAnswer(job, ifNoneMatch: ifNoneMatch)
        case .unchanged(let version):
            // The reader said it knows this version, so the answer is the bodiless `304`.
            return jobAnswer(id: id, version: version, ifNoneMatch: ifNoneMatch) { [] }
        case .notFound:
            return jobNotFound(id)
        }
    }

    /// Answers `204` once the deletion is committed.
    private func deleteJob(_ request: APIRequest, _ exchange: Exchange) {
        let id = request.pathParameters["id"] ?? ""
        engine.delete(id: id) { [self] outcome in
            switch outcome {
            case .success(.deleted):
                exchange.send(HTTPResponse(status: 204))
            case .success(.active(let job)):
                exchange.send(Self.error(409, "conflict", "job \(id) is \(job.state.rawValue); cancel it before deleting it"))
            case .success(.notFound):
                exchange.send(Self.jobNotFound(id))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    /// Answers once the cancelled states are committed, so that a `202` survives a crash.
    private func cancelJob(_ request: APIRequest, _ exchange: Exchange) {
        let id = request.pathParameters["id"] ?? ""
        engine.cancel(id: id) { [self] outcome in
            switch outcome {
            case .success(.cancelling(let job)):
                exchange.send(Self.json(202, Presentation.job(job)))
            case .success(.alreadyCancelled(let job)):
                exchange.send(Self.json(200, Presentation.job(job)))
            case .success(.alreadySettled(let job)):
                exchange.send(Self.error(409, "conflict", "job \(id) has already \(job.state.rawValue)"))
            case .success(.notFound):
                exchange.send(Self.jobNotFound(id))
            case .failure(let error as EngineError) where error.isShuttingDown:
                exchange.send(Self.error(503, "shutting_down", "the server is shutting down; cancel again after it restarts"))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    /// Answers once the reset job is committed, so that a `202` survives a crash (API.md §8).
    private func retryJob(_ request: APIRequest, _ exchange: Exchange) {
        let id = request.pathParameters["id"] ?? ""
        engine.retry(id: id) { [self] outcome in
            switch outcome {
            case .success(.retrying(let job)):
                exchange.send(Self.json(202, Presentation.job(job)))
            case .success(.notRetryable(let job)):
                exchange.send(
                    Self.error(409, "conflict", "job \(id) is \(job.state.rawValue); only a failed or cancelled job can be retried"))
            case .success(.notFound):
                exchange.send(Self.jobNotFound(id))
            case .success(.queueFull):
                refuseAsFull(exchange)
            case .failure(let error as EngineError) where error.isShuttingDown:
                exchange.send(Self.error(503, "shutting_down", "the server is shutting down; retry again after it restarts"))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    private func listNodes(_ request: APIRequest, _ exchange: Exchange) throws {
        let includeResult = try QueryParameters.includeResult(request.queryItems)
        let id = request.pathParameters["id"] ?? ""
        engine.nodeList(jobID: id, includeResults: includeResult) { [self] result in
            switch result {
            case .success(.nodes(let nodes)) where includeResult:
                exchange.send(Self.json(200, Presentation.nodeListBytes(nodes)))
            case .success(.nodes(let nodes)):
                do {
                    exchange.send(Self.answer(try Presentation.nodeListWithoutResultsAnswer(nodes, spool: spool)))
                } catch {
                    exchange.send(internalError(error, exchange))
                }
            case .success(.shown(let shown)):
                // Readers of the same job's nodes meanwhile share this copy (or file).
                exchange.send(Self.answer(shown))
            case .success(.notFound):
                exchange.send(Self.jobNotFound(id))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    private func getNode(_ request: APIRequest, _ exchange: Exchange) throws {
        let id = request.pathParameters["id"] ?? ""
        let nodeID = request.pathParameters["node"] ?? ""
        engine.node(jobID: id, nodeID: nodeID) { [self] result in
            switch result {
            case .success(.found(let node)):
                exchange.send(Self.json(200, Presentation.node(node, includeResult: true)))
            case .success(let missing):
                exchange.send(Self.nodeNotFound(id, nodeID, missing))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    private func getNodeBody(_ request: APIRequest, _ exchange: Exchange) {
        let id = request.pathParameters["id"] ?? ""
        let nodeID = request.pathParameters["node"] ?? ""
        engine.body(jobID: id, nodeID: nodeID) { [self] result in
            switch result {
            case .success(let body?): sendBody(body, exchange)
            case .success(nil): answerWithoutBody(jobID: id, nodeID: nodeID, exchange)
            case .failure(let error): exchange.send(internalError(error, exchange))
            }
        }
    }

    private func sendBody(_ body: StoredBody, _ exchange: Exchange) {
        let headers = HTTPHeaders([
            ("Content-Type", body.contentType ?? "application/octet-stream"), ("X-Content-Type-Options", "nosniff"),
        ])
        exchange.send(HTTPResponse(status: 200, headers: headers, body: body.bytes))
    }

    /// A node without a stored body: which of job, node and body is missing.
    private func answerWithoutBody(jobID id: String, nodeID: String, _ exchange: Exchange) {
        engine.node(jobID: id, nodeID: nodeID) { [self] result in
            switch result {
            case .success(.found):
                exchange.send(Self.error(404, "not_found", "node \(nodeID) of job \(id) has no stored response body"))
            case .success(let missing):
                exchange.send(Self.nodeNotFound(id, nodeID, missing))
            case .failure(let error):
                exchange.send(internalError(error, exchange))
            }
        }
    }

    /// `503 degraded` while store writes fail: the server still answers reads and keeps every accepted
    /// job (running in memory, its state retried), but refuses new work, so a load balancer should send
    /// that elsewhere — and most act on the status code alone.
    private func health(_ exchange: Exchange) {
        if isShuttingDown {
            exchange.send(Self.error(503, "shutting_down", "the server is shutting down"))
            return
        }
        let store = engine.storeHealth
        if store.degraded {
            var response = Self.json(
                503, .object([JSONMember("status", "degraded"), JSONMember("store", StoreHealthText.json(store))]))
            response.headers.set("Retry-After", "1")
            exchange.send(response)
        } else {
            exchange.send(Self.json(200, .object([JSONMember("status", "ok")])))
        }
    }

    private func metrics(_ exchange: Exchange) {
        engine.metrics { [engine, fetcher, httpRequests, webhooks] metrics in
            let snapshot = MetricsSnapshot(engine: metrics, fetcher: fetcher.stats, http: httpRequests.snapshot)
            let text = PrometheusText.render(snapshot) + StoreHealthText.metrics(engine.storeHealth)
                + PrometheusText.webhooks(webhooks?.stats ?? WebhookStats())
            exchange.send(
                HTTPResponse(
                    status: 200, headers: HTTPHeaders([("Content-Type", PrometheusText.contentType)]),
                    body: Array(text.utf8)))
        }
    }

    // MARK: Answers

    /// A JSON response.
    static func json(_ status: Int, _ value: JSONValue) -> HTTPResponse { json(status, value.bytes) }

    /// A JSON answer already shown.
    static func json(_ status: Int, _ body: [UInt8]) -> HTTPResponse {
        HTTPResponse(status: status, headers: HTTPHeaders([("Content-Type", "application/json")]), body: body)
    }

    /// A `200` of an answer already shown, sent from its file if it is kept in one, which it holds meanwhile.
    static func answer(_ shown: SettledAnswer) -> HTTPResponse {
        var response = json(200, shown.bytes)
        attach(shown, to: &response)
        return response
    }

    /// Makes `response` send `answer` from its file, if it is kept in one, or with the rest of its pieces after its
    /// first bytes (unless `response` has no body: a `304`), and hold it while the body is sent.
    static func attach(_ answer: SettledAnswer, to response: inout HTTPResponse) {
        if response.status == 200 {
            response.bodyFile = answer.file.map { HTTPFileBody(fd: $0.fd, count: $0.count) }
            response.bodyPieces = answer.pieces
        }
        response.bodyOwner = answer
    }

    /// A job's strong entity tag: a job's answer changes exactly when its version does.
    static func etag(id: String, version: Int64) -> String { "\"\(id)-\(version)\"" }

    /// Whether an `If-None-Match` header names `etag` (or is `*`); compared weakly, as RFC 9110 §13.1.2 says.
    static func ifNoneMatch(_ header: String?, matches etag: String) -> Bool {
        guard let header else { return false }
        for part in header.split(separator: ",") {
            var tag = part.trimmingCharacters(in: CharacterSet(charactersIn: " \t"))[...]
            if tag == "*" { return true }
            if tag.hasPrefix("W/") { tag = tag.dropFirst(2) }
            if tag == etag[...] { return true }
        }
        return false
    }

    /// A job's answer with its `ETag`: `304 Not Modified` without a body when `If-None-Match` names it, else `200`
    /// with the body `makeBody` gives.
    static func jobAnswer(id: String, version: Int64, ifNoneMatch: String?, _ makeBody: () -> [UInt8]) -> HTTPResponse {
        let tag = etag(id: id, version: version)
        if Self.ifNoneMatch(ifNoneMatch, matches: tag) {
            return HTTPResponse(status: 304, headers: HTTPHeaders([("ETag", tag)]))
        }
        return HTTPResponse(
            status: 200, headers: HTTPHeaders([("Content-Type", "application/json"), ("ETag", tag)]), body: makeBody())
    }

    static func jobAnswer(_ job: JobRecord, ifNoneMatch: String?) -> HTTPResponse {
        jobAnswer(id: job.id, version: job.version, ifNoneMatch: ifNoneMatch) { Presentation.jobBytes(job) }
    }

    /// An API error of §3.
    static func error(_ status: Int, _ code: String, _ message: String) -> HTTPResponse {
        json(status, Presentation.error(code: code, message: message))
    }

    /// `422 invalid_graph`: the first issue in `message` and `path`, all of them in `details`.
    static func invalidGraph(_ issues: [Presentation.Issue]) -> HTTPResponse {
        guard let first = issues.first else {
            return error(422, "invalid_graph", "the job is not valid")
        }
        let body = Presentation.error(
            code: "invalid_graph", message: Presentation.issueMessage(first), path: first.pointer, details: issues)
        return json(422, body)
    }

    private static func jobNotFound(_ id: String) -> HTTPResponse {
        error(404, "not_found", "no job with id \(id)")
    }

    private static func nodeNotFound(_ id: String, _ nodeID: String, _ missing: NodeLookup) -> HTTPResponse {
        if case .noSuchJob = missing { return jobNotFound(id) }
        return error(404, "not_found", "job \(id) has no node \(nodeID)")
    }

    /// `503 storage_unavailable`: the store is out of a resource (disk, descriptors, memory, the lock) for now.
    /// Nothing of the request was done; the same request may be sent again after `Retry-After`.
    private func storageUnavailable(_ error: StoreError, _ exchange: Exchange) -> HTTPResponse {
        // The store logs the failure itself, once per spell and at each retry; every refusal would flood the log.
        logger.debug("request refused: store unavailable", ["request_id": .string(exchange.requestID), "error": .string("\(error)")])
        var response = Self.error(
            503, "storage_unavailable", "the job store cannot be used right now (\(error.kind)); retry later")
        response.headers.set("Retry-After", "1")
        return response
    }

    /// The answer for an error no route expected: `503` when the store is out of a resource, else `500`.
    private func internalError(_ error: Error, _ exchange: Exchange) -> HTTPResponse {
        if let error = error as? StoreError, error.isResourceFailure { return storageUnavailable(error, exchange) }
        logger.error("request failed", ["request_id": .string(exchange.requestID), "error": .string("\(error)")])
        return Self.error(500, "internal", "internal error; request id \(exchange.requestID)")
    }

    /// Why a `POST /v1/jobs` body's media type is refused, or `nil` if it is JSON:
    /// `application/json`, with parameters, and if a charset is given it is UTF-8. A missing
    /// `Content-Type` is refused too, so that nothing but a deliberate JSON post becomes a job.
    static func mediaTypeProblem(_ contentType: String?) -> String? {
        guard let contentType else { return "the request body needs Content-Type: application/json" }
        // What nearly every client sends, answered without splitting, trimming and lowercasing.
        if contentType == "application/json" { return nil }
        let parts = contentType.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        guard parts.first == "application/json" else {
            return "the request body must be application/json, not \(contentType)"
        }
        for parameter in parts.dropFirst() where parameter.hasPrefix("charset=") {
            let charset = parameter.dropFirst("charset=".count).trimmingCharacters(in: CharacterSet(charactersIn: "\""))
            guard charset == "utf-8" || charset == "utf8" else {
                return "the request body must be UTF-8 JSON, not charset \(charset)"
            }
        }
        return nil
    }

    /// True for the engine's refusal of a list cursor it did not hand out.
    static func isBadCursor(_ error: Error) -> Bool {
        (error as? EngineError)?.isBadCursor == true
    }
}

/// Lets a non-`Sendable` wait token be cancelled from the connection's close callback.
private final class CancellableBox: @unchecked Sendable {
    // @unchecked: `token` is immutable, and each `Cancellable` (`Waiter`, `JobEventSubscriber`) guards its own
    // state with its `Lock`, so `cancel()` may run on any thread.
    private let token: Cancellable
    init(_ token: Cancellable) { self.token = token }
    func cancel() { token.cancel() }
}
