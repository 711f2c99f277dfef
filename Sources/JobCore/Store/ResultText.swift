/// A stored node's row as writing its result as text needs it: the result as the row holds it (JSON text, or `nil`),
/// and what `ResultAssembly` reads besides.
struct ResultRow {
    var id: String
    var parent: String?
    var state: NodeState
    var error: NodeError?
    /// The `result` column's text: the compact JSON `JSONValue.bytes` wrote.
    var result: [UInt8]?
    var source: ResultSource?
}

/// A stored job's result, written as JSON text from its nodes' rows (`ResultText.write`), with how many bytes it
/// is about to take (at least as many as it will, for a buffer reserved once).
public struct StoredResultText {
    public let capacityBytes: Int
    /// For a running job's list, how many of its entries are copied from the texts written as its children
    /// succeeded (`AnswerTexts`); `nil` for a stored result.
    var fromTexts: Int?
    let write: (inout AnswerSink) throws -> Void

    /// Appends the result's text to `out`.
    public func write(to out: inout AnswerSink) throws { try write(&out) }
}

/// A stored job's nodes with their results, the results written as JSON text from the rows (`ResultText`), never
/// held as values: what `GET /v1/jobs/{id}/nodes?include=result` shows of a settled job.
public struct StoredNodeListText {
    /// The job's nodes in tree order, without their results.
    public let nodes: [NodeRecord]
    /// At least as many bytes as the results take but for escapes, for a buffer reserved once.
    public let resultBytes: Int
    let write: (inout AnswerSink, (Int, inout [UInt8]) -> Void) throws -> Void

    /// Appends to `out`, for each of `nodes` in turn, what `before` writes (given the node's index, to the sink's
    /// buffer) and then the node's result (`null` when it has none). A fetch's result, which a list holding it
    /// shows again, is written once and copied from there.
    public func write(to out: inout AnswerSink, before: (Int, inout [UInt8]) -> Void) throws { try write(&out, before) }
}

/// Writes a stored result as the text `ResultAssembly` then `JSONValue.bytes` would make of it, without making the
/// values: a row whose result is written in full is copied as it is stored (the compact text of the same value), a
/// list's result is its children's entries in turn, and only a fetch whose body is kept apart is parsed, to put its
/// body in. What is held meanwhile is the rows' text and one fetch's result, not the job's results as values, with
/// which a read of a job of 100,000 fetches of 1 KiB peaked at 547 MiB for its 142 MB answer (227 MiB this way).
enum ResultText {
    /// Writes the result of `rows[0]` (a subtree's rows in position order, its root first) to `out`.
    /// - Parameter body: the stored response body of the fetch node with this id, if any.
    /// - Throws: `StoreError.corrupt` where `ResultAssembly.assemble` would.
    static func write(_ rows: [ResultRow], into out: inout AnswerSink, body: (String) throws -> [UInt8]?) throws {
        guard !rows.isEmpty else { throw StoreError(.corrupt, "no row to write a result from") }
        let children = ResultAssembly.children(of: rows, id: \.id, parent: \.parent)
        // Each fetch's result is written once here: nothing to copy.
        var written: [Int: Range<Int>]?
        try write(rows, children: children, root: 0, into: &out, written: &written, body: body)
    }

    /// Writes the result of `rows[root]` to `out`; `rows` are one job's rows in position order, `children` their
    /// index (`ResultAssembly.children`).
    /// - Parameter written: where in `out` the results of fetches were written before (by row), to be copied from
    ///   there; those written now are added. `nil`: none is written twice.
    static func write(
        _ rows: [ResultRow], children: [[Int]], root: Int, into out: inout AnswerSink, written: inout [Int: Range<Int>]?,
        body: (String) throws -> [UInt8]?
    ) throws {
        // Lists whose entries are being written: the list's row, its next child, and whether errors are consumed.
        var open: [(row: Int, next: Int, consumeErrors: Bool)] = []

        /// Writes the result of row `k`, or opens its list.
        func result(of k: Int) throws {
            var k = k
            // A result that is one child's (`fire_on_first_result`) is that child's, however deep.
            while case .child(let c)? = rows[k].source {
                guard c < children[k].count else {
                    throw StoreError(.corrupt, "the result of node \(rows[k].id) refers to a child without one")
                }
                k = children[k][c]
            }
            switch rows[k].source {
            case .children(let consumeErrors):
                out.append(UInt8(ascii: "["))
                open.append((k, 0, consumeErrors))
            case .body:
                guard let text = rows[k].result else {
                    throw StoreError(.corrupt, "node \(rows[k].id) succeeded without a stored result")
                }
                if let range = written?[k] {
                    try out.appendCopy(of: range)
                } else {
                    let start = out.count
                    try withBody(text, of: rows[k].id, body).append(to: &out.buffer)
                    written?[k] = start..<out.count
                }
            case .child, nil:
                guard let text = rows[k].result else {
                    throw StoreError(.corrupt, "node \(rows[k].id) succeeded without a stored result")
                }
                // Parsed only to be checked, as reading it as a value would: a damaged row fails the read rather
                // than reaching a reader as JSON that is not. Rows of full results are few and small: a fetch keeps
                // its body apart.
                _ = try parsed(text, of: rows[k].id)
                out.append(contentsOf: text)
            }
        }

        try result(of: root)
        while let top = open.last {
            let list = children[top.row]
            guard top.next < list.count else {
                out.append(UInt8(ascii: "]"))
                open.removeLast()
                continue
            }
            open[open.count - 1].next += 1
            if top.next > 0 { out.append(UInt8(ascii: ",")) }
            let c = list[top.next]
            if rows[c].state == .succeeded {
                try result(of: c)
            } else if top.consumeErrors {
                out.append(contentsOf: "null".utf8)
            } else {
                // As `ResultAssembly.entry` makes it.
                JSONValue.object([JSONMember("error", rows[c].error?.json ?? .null)]).append(to: &out.buffer)
            }
            try out.flushIfFull()
        }
    }

    /// The result of each row as the node list shows it (`StoredNodeListText`): `null` for a row with none.
    static func writeShown(
        _ rows: [ResultRow], children: [[Int]], row k: Int, into out: inout AnswerSink, written: inout [Int: Range<Int>]?,
        body: (String) throws -> [UInt8]?
    ) throws {
        if rows[k].source == nil && rows[k].result == nil {
            out.append(contentsOf: "null".utf8)
        } else {
            try write(rows, children: children, root: k, into: &out, written: &written, body: body)
        }
    }

    /// For each row, at least the length its result's text takes but for escapes: a list's is its entries', a
    /// fetch's adds its body as base64 (4/3 of its bytes, the most a body's text takes but for escapes).
    /// - Parameter bodyBytes: the stored response body's length of each fetch node with one, by row.
    static func sizes(_ rows: [ResultRow], children: [[Int]], bodyBytes: [Int]) -> [Int] {
        var sizes = [Int](repeating: 0, count: rows.count)
        // Children come after their parents: from the last row to the first, every child is sized before its parent.
        for k in rows.indices.reversed() {
            let own = rows[k].result?.count ?? 4
            switch rows[k].source {
            case .children(let consumeErrors):
                var total = 2
                for c in children[k] {
                    if rows[c].state == .succeeded {
                        total += 1 + sizes[c]
                    } else {
                        // `null`, or `{"error":…}` (as `write` makes it).
                        total += 1 + (consumeErrors ? 4 : 10 + (rows[c].error?.json.unescapedByteCount ?? 4))
                    }
                }
                sizes[k] = total
            case .child(let c):
                sizes[k] = c < children[k].count ? sizes[children[k][c]] : own
            case .body:
                sizes[k] = own + bodyBytes[k] / 3 * 4 + 4
            case nil:
                sizes[k] = own
            }
        }
        return sizes
    }

    /// A fetch's stored result (`"body": null`) with its body put in, as `ResultAssembly` puts it.
    private static func withBody(_ text: [UInt8], of id: String, _ body: (String) throws -> [UInt8]?) throws -> JSONValue {
        var node = NodeRecord(jobID: "", id: id, parent: nil, position: 0, type: "fetch", state: .succeeded)
        node.result = try parsed(text, of: id)
        let raw = try body(id).map { [id: $0] } ?? [:]
        try ResultAssembly.fillBody(&node, from: raw)
        return node.result ?? .null
    }

    /// A stored result's text as a value; `StoreError.corrupt` if it is not JSON.
    private static func parsed(_ text: [UInt8], of id: String) throws -> JSONValue {
        do {
            return try JSONValue.parse(text, maxDepth: Limits.storedJSONDepth)
        } catch {
            throw StoreError(.corrupt, "stored result of node \(id) is not JSON: \(error)")
        }
    }
}
