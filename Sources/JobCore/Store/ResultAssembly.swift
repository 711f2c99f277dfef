/// Where a stored result comes from when the row does not hold it in full (`result_ref` of `jobs` and `nodes`).
///
/// A list's result is its children's results again, a job's is its root's, and a fetch's `body` is the response
/// body the `bodies` table keeps anyway: written out in full, a job of N fetches nested d lists deep would store
/// each response d + 2 times. The engine sets the hint only where it checked that the value is exactly what
/// assembly gives (`JobRun.storedResultSource`), so a read rebuilds the same value, byte for byte.
public enum ResultSource: Equatable, Sendable {
    /// The array of the children's entries in position order: a succeeded child's result, else
    /// `{"error": <its error>}`, or `null` with `consumeErrors` (a list, sequence or map).
    case children(consumeErrors: Bool)
    /// The result of the `k`th child in position order (a list or map with `fire_on_first_result`); for a job,
    /// `child(0)` is its root node's result.
    case child(Int)
    /// A fetch's result whose `body` member is rebuilt from the stored response body by its `body_encoding`.
    case body

    /// The column's value: 1 children, 2 children with errors consumed, 3 body, 4 + k the `k`th child.
    public var code: Int {
        switch self {
        case .children(let consumeErrors): return consumeErrors ? 2 : 1
        case .body: return 3
        case .child(let k): return 4 + k
        }
    }

    /// The source a column value names; `nil` for SQL `NULL` (the result is written in full).
    /// - Throws: `StoreError.corrupt` for a value no version of the store wrote.
    public init?(code: Int?) throws {
        guard let code else { return nil }
        switch code {
        case 1: self = .children(consumeErrors: false)
        case 2: self = .children(consumeErrors: true)
        case 3: self = .body
        case 4...: self = .child(code - 4)
        default: throw StoreError(.corrupt, "unknown result_ref \(code)")
        }
    }
}

/// The one place that turns results into what the stores write, and what they read back into results.
enum ResultAssembly {
    /// What a store writes for `result` with the hint `source`: the `result` column (`nil` for SQL `NULL`) and
    /// `result_ref`. A result that refers to others is not written at all; a fetch's is written with `"body": null`
    /// (its place kept, so the members come back in their order).
    static func stored(_ result: JSONValue?, _ source: ResultSource?) -> (result: JSONValue?, ref: Int?) {
        guard let result, let source else { return (result, nil) }
        switch source {
        case .children, .child:
            return (nil, source.code)
        case .body:
            guard case .object(var members) = result, let k = bodyMember(members) else { return (result, nil) }
            members[k].value = .null
            return (.object(members), source.code)
        }
    }

    /// The index of the one member named `body`, and only if there is one with a `body_encoding` string.
    static func bodyMember(_ members: [JSONMember]) -> Int? {
        var found: Int?
        var encoding = false
        for (k, member) in members.enumerated() {
            if member.key == "body" {
                if found != nil { return nil }
                found = k
            } else if member.key == "body_encoding" {
                encoding = member.value.stringValue != nil
            }
        }
        return encoding ? found : nil
    }

    /// A child's place in its parent's results array, as `JobRun.entry` makes it, from the three fields of its
    /// record it reads: a record passed whole was copied, every field retained and released, for each child of a
    /// list checked as it settles (`JobRun.storedResultSource`): 46 of the check's 90 `perf` samples (at 2 kHz) as
    /// a list of 100,000 fetches settled.
    static func entry(state: NodeState, result: JSONValue?, error: NodeError?, consumeErrors: Bool) -> JSONValue? {
        if state == .succeeded { return result }
        if consumeErrors { return .null }
        return .object([JSONMember("error", error?.json ?? .null)])
    }

    /// The body as the fetcher read it from `raw`: `BodyDecoder.decode` itself, asked for the encoding the result
    /// names (`json` parsed with the fetcher's parser and depth limit, `text` the UTF-8 string, `base64` encoded),
    /// so that the two cannot drift apart.
    static func body(_ raw: [UInt8], encoding: String) throws -> JSONValue {
        let expect: FetchExpect
        switch encoding {
        case "json": expect = .json
        case "text": expect = .text
        case "base64": expect = .bytes
        default: throw StoreError(.corrupt, "stored result has an unknown body_encoding \(encoding)")
        }
        switch BodyDecoder.decode(raw, contentType: nil, expect: expect) {
        case .value(let (value, decodedAs)) where decodedAs == encoding:
            return value
        case .value, .invalidJSON:
            throw StoreError(.corrupt, "the stored response body does not read as the \(encoding) its result was read from")
        }
    }

    /// Fills in the results of `nodes` — one job's rows in position order as read (results as `stored` wrote
    /// them, `resultSource` from `result_ref`) — that refer to others; with `target`, only the results in that
    /// node's subtree (which must all be among `nodes`). Bottom-up over parent links: a child's position is
    /// always after its parent's (a map's copies come after every submitted node), so one pass from the last
    /// row to the first sees every child before its parent. Linear in rows and bytes.
    /// - Parameter bodies: the stored response bodies of the fetch nodes with these ids (asked for `bodyBatch` at a
    ///   time).
    /// - Throws: `StoreError.corrupt` when a reference finds nothing to refer to.
    static func assemble(
        _ nodes: inout [NodeRecord], target: Int? = nil, bodies: ([String]) throws -> [String: [UInt8]]
    ) throws {
        guard nodes.contains(where: { $0.resultSource != nil }) else { return }
        let children = Self.children(of: nodes, id: \.id, parent: \.parent)
        var inScope: [Bool]
        if let target {
            inScope = [Bool](repeating: false, count: nodes.count)
            var stack = [target]
            while let k = stack.popLast() {
                inScope[k] = true
                stack.append(contentsOf: children[k])
            }
        } else {
            inScope = [Bool](repeating: true, count: nodes.count)
        }
        // Bodies are read and filled in a batch at a time: only one batch of raw bodies is held besides the results.
        let wanted = nodes.indices.filter { inScope[$0] && nodes[$0].resultSource == .body && nodes[$0].result != nil }
        for start in stride(from: 0, to: wanted.count, by: bodyBatch) {
            let batch = wanted[start..<min(start + bodyBatch, wanted.count)]
            let raw = try bodies(batch.map { nodes[$0].id })
            for k in batch { try fillBody(&nodes[k], from: raw) }
        }
        for k in nodes.indices.reversed() where inScope[k] {
            guard let source = nodes[k].resultSource else { continue }
            let id = nodes[k].id
            switch source {
            case .body:
                continue
            case .children(let consumeErrors):
                var entries: [JSONValue] = []
                entries.reserveCapacity(children[k].count)
                for c in children[k] {
                    let entry = entry(
                        state: nodes[c].state, result: nodes[c].result, error: nodes[c].error, consumeErrors: consumeErrors)
                    guard let entry else {
                        throw StoreError(.corrupt, "node \(nodes[c].id) succeeded without a stored result")
                    }
                    entries.append(entry)
                }
                nodes[k].result = .array(entries)
            case .child(let c):
                guard c < children[k].count, let result = nodes[children[k][c]].result else {
                    throw StoreError(.corrupt, "the result of node \(id) refers to a child without one")
                }
                nodes[k].result = result
            }
        }
    }

    /// Each row's children, as indices in `rows` in row order: `rows` are one job's in position order, where a child
    /// comes after its parent.
    static func children<Row>(of rows: [Row], id: (Row) -> String, parent: (Row) -> String?) -> [[Int]] {
        tree(of: rows, id: id, parent: parent).children
    }

    /// `children(of:id:parent:)`, and the row of each id, which finding them takes.
    static func tree<Row>(
        of rows: [Row], id: (Row) -> String, parent: (Row) -> String?
    ) -> (children: [[Int]], index: [String: Int]) {
        var index: [String: Int] = [:]
        index.reserveCapacity(rows.count)
        var children = [[Int]](repeating: [], count: rows.count)
        for k in rows.indices {
            if let parent = parent(rows[k]), let p = index[parent] { children[p].append(k) }
            index[id(rows[k])] = k
        }
        return (children, index)
    }

    /// How many response bodies `assemble` reads at once. A read of a stored job of 100,000 fetches of 1 KiB held
    /// every raw body (and its key) beside the results made from them, some 120 MB more at its peak.
    static let bodyBatch = 1_024

    /// Fills in the `body` member of `node`'s result (stored with `"body": null`) from its raw response body.
    static func fillBody(_ node: inout NodeRecord, from raw: [String: [UInt8]]) throws {
        guard case .object(var members)? = node.result else { return }
        guard let b = bodyMember(members), let encoding = node.result?["body_encoding"]?.stringValue else {
            throw StoreError(.corrupt, "stored result of node \(node.id) has no body to fill in")
        }
        guard let bytes = raw[node.id] else {
            throw StoreError(.corrupt, "the response body of node \(node.id) is not stored")
        }
        let decoded = try body(bytes, encoding: encoding)
        // Out of the record while it changes, so that its members array is not copied.
        node.result = nil
        members[b].value = decoded
        node.result = .object(members)
    }

    /// Fills in the job's result from its root's, when its row refers to it; `nodes` are the job's rows with
    /// (at least) the root's result assembled.
    static func assemble(_ job: inout JobRecord, nodes: [NodeRecord]) throws {
        guard let source = job.resultSource else { return }
        guard source == .child(0), let root = nodes.first(where: { $0.position == 0 }), let result = root.result else {
            throw StoreError(.corrupt, "the result of job \(job.id) refers to a root without one")
        }
        job.result = result
    }

    /// Jobs loaded to run again, each with its node rows (taken out of `byJob`) in position order and its settled nodes' results (and its
    /// own) assembled, for their parents and for references to them. A job with a row that could not be read
    /// (`badNodes`) or a reference that finds nothing is left out and added to `skipped`, to be failed alone.
    /// - Parameter bodies: the stored response bodies of one job's fetch nodes with these ids.
    static func loaded(
        _ jobs: [JobRecord], nodes byJob: inout [String: [NodeRecord]], badNodes: [String: StoreError],
        skipped: inout [UnreadableJob], bodies: (_ jobID: String, _ nodeIDs: [String]) throws -> [String: [UInt8]]
    ) throws -> [(job: JobRecord, nodes: [NodeRecord])] {
        var out: [(job: JobRecord, nodes: [NodeRecord])] = []
        out.reserveCapacity(jobs.count)
        for var job in jobs {
            if let error = badNodes[job.id] {
                skipped.append(UnreadableJob(job: job, error: error))
                continue
            }
            var nodes = byJob.removeValue(forKey: job.id) ?? []
            let inOrder = zip(nodes, nodes.dropFirst()).allSatisfy { $0.position < $1.position }
            if !inOrder { nodes.sort { $0.position < $1.position } }
            let id = job.id
            do {
                try assemble(&nodes) { try bodies(id, $0) }
                try assemble(&job, nodes: nodes)
            } catch let error as StoreError where error.kind == .corrupt {
                skipped.append(UnreadableJob(job: job, error: error))
                continue
            }
            out.append((job: job, nodes: nodes))
        }
        return out
    }

    /// Whether reading `job`'s result needs its node rows.
    static func needsNodes(_ job: JobRecord) -> Bool { job.resultSource != nil }

    /// Fills in the job's result when its row refers to its root's: the job's node rows are read and assembled.
    /// - Parameters:
    ///   - rows: the job's stored node rows from a position on, in position order.
    ///   - bodies: the stored response bodies of the fetch nodes with these ids.
    static func assembleResult(
        of job: inout JobRecord, rows: (Int) throws -> [NodeRecord], bodies: ([String]) throws -> [String: [UInt8]]
    ) throws {
        guard needsNodes(job) else { return }
        var nodes = try rows(0)
        guard !nodes.isEmpty, nodes[0].position == 0 else {
            throw StoreError(.corrupt, "the result of job \(job.id) refers to a root that is not stored")
        }
        try assemble(&nodes, target: 0, bodies: bodies)
        try assemble(&job, nodes: nodes)
    }

    /// Fills in the result of `node` (as read) when it refers to others: the rows of its subtree (all after it in
    /// position order) are read and assembled.
    static func assembleResult(
        of node: inout NodeRecord, rows: (Int) throws -> [NodeRecord], bodies: ([String]) throws -> [String: [UInt8]]
    ) throws {
        guard let source = node.resultSource, node.result != nil || source != .body else { return }
        var subtree = source == .body ? [node] : try rows(node.position)
        guard subtree.first?.position == node.position else {
            throw StoreError(.corrupt, "node \(node.id) of job \(node.jobID) is not stored at position \(node.position)")
        }
        try assemble(&subtree, target: 0, bodies: bodies)
        node = subtree[0]
    }
}
