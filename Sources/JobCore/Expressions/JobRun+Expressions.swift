// Where a running job meets API.md §6: a node's expressions are resolved
// just before it starts, and its `select` narrows its result as it succeeds.

extension JobRun {
    /// Resolves node `i`'s expressions against the job's scope, keeping the fetch's request in
    /// `resolvedRequests` and handing back its recover value.
    ///
    /// A recover value that cannot be resolved leaves the node without one; a request that cannot be built fails
    /// the node before any transfer, and its recover value still applies.
    /// - Returns: the error the node fails with, or `nil` when it may start.
    func resolveExpressions(_ i: Int, recover: inout JSONValue?) -> NodeError? {
        guard let flow = graph.nodes[i].dataflow, flow.recover != nil || flow.buildsRequest else { return nil }
        // The scope borrows the run's records: nothing is copied, and nothing changes them while it lives.
        let scope = ExpressionScope(input: record.input, graph: graph, nodes: nodes, copy: graph.nodes[i].copy)
        if let template = flow.recover {
            switch ExpressionResolver.value(template, in: scope, place: "recover") {
            case .success(let value):
                recover = value
            case .failure(var error):
                recover = nil
                error.node = graph.nodes[i].id
                return error
            }
        }
        guard case .fetch(let written) = graph.nodes[i].kind else { return nil }
        // A fetch that had started before a restart sends what it sent then.
        if let stored = nodes[i].request, let request = RequestRecord.request(from: stored, base: written) {
            resolvedRequests[i] = request
        } else if flow.buildsRequest {
            switch ExpressionResolver.request(written, flow, in: scope) {
            case .success(let request): resolvedRequests[i] = request
            case .failure(var error):
                error.node = graph.nodes[i].id
                return error
            }
        }
        return nil
    }

    /// The link that applies `select` to a node's result: the value at the pointer, or a `ref_unresolved` failure.
    static func selecting(_ path: JSONPointerPath, node: String) -> Deferred.Callback {
        { result in
            guard let value = result as? JSONValue else { return result }
            switch ExpressionResolver.select(path, from: value) {
            case .success(let selected): return selected
            case .failure(var error):
                error.node = node
                return Failure(error)
            }
        }
    }
}
