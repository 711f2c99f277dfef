// Where the store may take a settled node's result from instead of writing it again (`ResultSource`). Only the
// write changes: the run keeps every result whole in memory, and reads assemble the same value from the rows.

extension JobRun {
    /// For node `i`, which just succeeded with `result`: its children's entries or one child's result, when
    /// `result` is exactly what `ResultAssembly` makes of them; else `nil` (the result is written as it is).
    /// Checked by value rather than inferred from the options, so a `select`, a `recover` or an entry that differs
    /// from its child's stored error can never be assembled wrong; a child's result shares its storage with the
    /// entry, so the comparison costs about one step per child.
    func storedResultSource(_ i: Int, result: JSONValue) -> ResultSource? {
        // Asked for every node that succeeds, most of them fetches: their graph node is not copied to learn that.
        if case .fetch = graph.nodes[i].kind { return nil }
        let node = graph.nodes[i]
        let children: [Int]
        let options: ListOptions
        switch node.kind {
        case .fetch:
            return nil
        case .list(let list):
            (children, options) = (node.children, list)
        case .sequence:
            (children, options) = (node.children, ListOptions())
        case .map(let spec):
            (children, options) = (graph.expansions[i] ?? [], spec.options)
        }
        // Reads find children by their parent's id.
        guard graph.index(ofNodeID: node.id) == i else { return nil }
        if options.fireOnFirstResult {
            for (k, c) in children.enumerated() where nodes[c].state == .succeeded && nodes[c].result == result {
                return .child(k)
            }
            return nil
        }
        guard case .array(let entries) = result, entries.count == children.count else { return nil }
        for (entry, c) in zip(entries, children) {
            let assembled = ResultAssembly.entry(
                state: nodes[c].state, result: nodes[c].result, error: nodes[c].error, consumeErrors: options.consumeErrors)
            guard assembled == entry else { return nil }
        }
        return .children(consumeErrors: options.consumeErrors)
    }

    /// After a fetch succeeded with `json`, the result of `response`: marks it as rebuilt from the response body
    /// the run stores for it, when the node kept that result (no `select` changed it) and `response.body` is
    /// what `ResultAssembly.body` makes of the raw bytes.
    func markBodyResult(_ i: Int, _ response: FetchResponse, json: JSONValue, stored: FetchResponse?) {
        guard nodes[i].state == .succeeded, !nodes[i].recovered, let result = nodes[i].result, result == json,
            let stored, stored.rawBody == response.rawBody, response.bytes == response.rawBody.count
        else { return }
        let count = response.rawBody.count
        switch (response.bodyEncoding, response.body) {
        case ("json", _):
            break
        case ("text", .string(let text)) where text.utf8.count == count:
            break
        case ("base64", .string(let text)) where text.utf8.count == (count + 2) / 3 * 4:
            break
        default:
            return
        }
        guard case .object(let members) = result, ResultAssembly.bodyMember(members) != nil else { return }
        nodes[i].resultSource = .body
    }
}
