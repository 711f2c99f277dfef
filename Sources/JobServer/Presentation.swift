import Foundation
import JobCore

/// The JSON shapes of API.md: jobs (§1.4), nodes (§2) and API errors (§3), field order as documented.
enum Presentation {
    /// One problem of an invalid job: a JSON Pointer into the request body and what is wrong there.
    typealias Issue = (pointer: String, message: String)

    /// A time field: RFC 3339 with milliseconds, or `null`.
    static func time(_ ms: Int64?) -> JSONValue {
        guard let ms else { return .null }
        return .string(Timestamp.format(ms))
    }

    /// `percent` with exactly one decimal, as a JSON number (`33.3`, `100.0`, `0.0`).
    static func percent(_ progress: JobCore.Progress) -> JSONValue {
        var tenths = 0
        if progress.total > 0 {
            let exact = Double(progress.done) * 1000 / Double(progress.total)
            tenths = Int(exact.rounded())
        }
        return .number("\(tenths / 10).\(tenths % 10)")
    }

    /// The progress object of §1.4.
    static func progress(_ p: JobCore.Progress) -> JSONValue {
        .object([
            JSONMember("total", .int(p.total)),
            JSONMember("pending", .int(p.pending)),
            JSONMember("running", .int(p.running)),
            JSONMember("succeeded", .int(p.succeeded)),
            JSONMember("failed", .int(p.failed)),
            JSONMember("cancelled", .int(p.cancelled)),
            JSONMember("skipped", .int(p.skipped)),
            JSONMember("done", .int(p.done)),
            JSONMember("percent", percent(p)),
        ])
    }

    /// The job object of §1.4; the list route leaves `result` out.
    static func job(_ job: JobRecord, includeResult: Bool = true) -> JSONValue {
        var members = [
            JSONMember("id", .string(job.id)),
            JSONMember("name", job.name.map(JSONValue.string) ?? .null),
            JSONMember("state", .string(job.state.rawValue)),
            JSONMember("created_at", time(job.createdAt)),
            JSONMember("started_at", time(job.startedAt)),
            JSONMember("finished_at", time(job.finishedAt)),
            JSONMember("progress", progress(job.progress)),
        ]
        if includeResult { members.append(JSONMember("result", job.result ?? .null)) }
        members += [
            JSONMember("error", job.error?.json ?? .null),
            JSONMember("metadata", job.metadata ?? .null),
        ]
        // Only a job given an input shows it, and like `result` only on the job itself, not in listings.
        if includeResult, let input = job.input { members.append(JSONMember("input", input)) }
        members += scheduling(job)
        // Like `input`, only on the job itself: not in lists, event streams or webhook bodies.
        if includeResult, let notify = job.notify ?? (job.notifyURL == nil ? nil : .pending) {
            members.append(JSONMember("notify", Self.notify(notify)))
        }
        members.append(JSONMember("version", .int(job.version)))
        return .object(members)
    }

    /// API.md §8: `attempt` always; `not_before`, `concurrency_key` and `concurrency_limit` when given;
    /// `queue_position` while the job waits for a slot of its key.
    static func scheduling(_ job: JobRecord) -> [JSONMember] {
        var members: [JSONMember] = []
        if let notBefore = job.notBefore { members.append(JSONMember("not_before", time(notBefore))) }
        if let key = job.concurrencyKey {
            members.append(JSONMember("concurrency_key", .string(key)))
            members.append(JSONMember("concurrency_limit", .int(job.concurrencyLimit ?? 1)))
        }
        if let position = job.queuePosition { members.append(JSONMember("queue_position", .int(position))) }
        members.append(JSONMember("attempt", .int(job.attempt)))
        return members
    }

    /// A job's webhook delivery (API.md §8).
    static func notify(_ status: NotifyStatus) -> JSONValue {
        .object([
            JSONMember("state", .string(status.state)),
            JSONMember("attempts", .int(status.attempts)),
            JSONMember("last_status", status.lastStatus.map { .int($0) } ?? .null),
        ])
    }

    /// The body of a webhook delivery: the job object without `result`.
    @Sendable static func webhookBytes(_ record: JobRecord) -> [UInt8] { job(record, includeResult: false).bytes }

    /// The bytes of `GET /v1/jobs/{id}`'s answer: the job object with its result.
    @Sendable static func jobBytes(_ record: JobRecord) -> [UInt8] { job(record).bytes }

    /// `jobBytes` of `record` with the result that `result` writes: the job object is written around it, the result
    /// written into the answer, never held as values; a large answer to a temporary file (`spool`).
    static func jobAnswer(_ record: JobRecord, result: StoredResultText, spool: AnswerSpool) throws -> SettledAnswer {
        guard case .object(let members) = job(record), let k = members.firstIndex(where: { $0.key == "result" }), k > 0
        else { return SettledAnswer(jobBytes(record)) }
        // `{…}` of the members before the result, and of those after it: each written as an object and cut.
        let head = JSONValue.object(Array(members[..<k])).bytes
        let tail = JSONValue.object(Array(members[(k + 1)...])).bytes
        return try spool.answer(estimate: head.count + tail.count + 16 + result.capacityBytes) { out in
            out.append(contentsOf: head.dropLast())
            out.append(contentsOf: #","result":"#.utf8)
            try result.write(to: &out)
            if tail.count > 2 {
                out.append(UInt8(ascii: ","))
                out.append(contentsOf: tail.dropFirst())
            } else {
                out.append(UInt8(ascii: "}"))
            }
        }
    }

    /// One node of `GET /v1/jobs/{id}/nodes`; `result` only when asked for.
    static func node(_ node: NodeRecord, includeResult: Bool) -> JSONValue {
        var members = [
            JSONMember("id", .string(node.id)),
            JSONMember("parent", node.parent.map(JSONValue.string) ?? .null),
            JSONMember("type", .string(node.type)),
            JSONMember("state", .string(node.state.rawValue)),
            JSONMember("attempts", .int(node.attempts)),
            JSONMember("started_at", time(node.startedAt)),
            JSONMember("finished_at", time(node.finishedAt)),
            JSONMember("elapsed_ms", node.elapsedMs.map { .int($0) } ?? .null),
            JSONMember("status", node.status.map { .int($0) } ?? .null),
            JSONMember("error", node.error?.json ?? .null),
            JSONMember("recovered", .bool(node.recovered)),
        ]
        // A paginated fetch shows how many pages it has fetched (so far, while it runs).
        if let pages = node.pages { members.append(JSONMember("pages", .int(pages))) }
        // A fetch that has started shows what it sent, credentials masked.
        if let request = node.request { members.append(JSONMember("request", RequestRecord.shown(request))) }
        if includeResult { members.append(JSONMember("result", node.result ?? .null)) }
        return .object(members)
    }

    /// `{"jobs": […], "next_cursor": …}`.
    static func jobList(_ jobs: [JobRecord], nextCursor: String?) -> JSONValue {
        .object([
            JSONMember("jobs", .array(jobs.map { job($0, includeResult: false) })),
            JSONMember("next_cursor", nextCursor.map(JSONValue.string) ?? .null),
        ])
    }

    /// `{"nodes": […]}`.
    static func nodeList(_ nodes: [NodeRecord], includeResult: Bool) -> JSONValue {
        .object([JSONMember("nodes", .array(nodes.map { node($0, includeResult: includeResult) }))])
    }

    /// `GET /v1/jobs/{id}/nodes?include=result`, as bytes: how the engine shows a settled job's nodes.
    @Sendable static func nodeListBytes(_ nodes: [NodeRecord]) -> [UInt8] { nodeList(nodes, includeResult: true).bytes }

    /// `nodeList(nodes, includeResult: false).bytes`, written a node at a time, never held as values; a large list
    /// to a temporary file (`spool`). The 100,000 nodes of one job are 31 MB of text: made as values first, reading
    /// them from the store took the server from 180 to 389 MiB, and written into memory a node at a time, to 263–269.
    static func nodeListWithoutResultsAnswer(_ nodes: [NodeRecord], spool: AnswerSpool) throws -> SettledAnswer {
        // A node's object is about 310 bytes (its times, state and ids); room not written is never touched.
        try spool.answer(estimate: 16 + nodes.count * 384) { out in
            out.append(contentsOf: #"{"nodes":["#.utf8)
            for (k, record) in nodes.enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                node(record, includeResult: false).append(to: &out.buffer)
                try out.flushIfFull()
            }
            out.append(contentsOf: "]}".utf8)
        }
    }

    /// `nodeListBytes` of the stored nodes `list` gives, each result written by it into the answer, never held as
    /// values; a large answer to a temporary file (`spool`): the nodes of a job of 100,000 fetches with their
    /// results are 317 MB.
    static func nodeListAnswer(_ list: StoredNodeListText, spool: AnswerSpool) throws -> SettledAnswer {
        // About what the answer takes: each node's object is a few hundred bytes.
        try spool.answer(estimate: list.resultBytes + list.nodes.count * 320 + 16) { out in
            out.append(contentsOf: #"{"nodes":["#.utf8)
            try list.write(to: &out) { k, out in
                // Each node's object without its closing brace, then its result as its last member; the brace is
                // written before the next node's object, and after the last.
                if k > 0 { out.append(contentsOf: "},".utf8) }
                out.append(contentsOf: node(list.nodes[k], includeResult: false).bytes.dropLast())
                out.append(contentsOf: #","result":"#.utf8)
            }
            out.append(contentsOf: (list.nodes.isEmpty ? "]}" : "}]}").utf8)
        }
    }

    /// `{"error": {"code", "message", "path"?, "details"?}}`.
    static func error(code: String, message: String, path: String? = nil, details: [Issue]? = nil) -> JSONValue {
        var members = [JSONMember("code", .string(code)), JSONMember("message", .string(message))]
        if let path { members.append(JSONMember("path", .string(path))) }
        if let details {
            let list = details.map {
                JSONValue.object([JSONMember("path", .string($0.pointer)), JSONMember("message", .string($0.message))])
            }
            members.append(JSONMember("details", .array(list)))
        }
        return .object([JSONMember("error", .object(members))])
    }

    /// A JSON Pointer in the dotted form API.md's messages use: `/graph/children/2/url` → `graph.children[2].url`.
    static func dottedPath(_ pointer: String) -> String {
        guard !pointer.isEmpty else { return "" }
        var out = ""
        for raw in pointer.split(separator: "/", omittingEmptySubsequences: false).dropFirst() {
            let token = raw.replacingOccurrences(of: "~1", with: "/").replacingOccurrences(of: "~0", with: "~")
            if !token.isEmpty, token.allSatisfy({ $0.isASCII && $0.isNumber }), !out.isEmpty {
                out += "[\(token)]"
            } else {
                out += out.isEmpty ? token : ".\(token)"
            }
        }
        return out
    }

    /// `graph.children[2].url: scheme must be http or https`; the message alone for the document itself.
    static func issueMessage(_ issue: Issue) -> String {
        let where_ = dottedPath(issue.pointer)
        return where_.isEmpty ? issue.message : "\(where_): \(issue.message)"
    }
}
