// The ordering rule of API.md §6.2: a node may read only nodes certain to have
// settled before it starts — an earlier child of a `sequence` that contains
// it, or a descendant of such a child.
//
// With the graph in pre-order, node X is such a node for reader R exactly when
// the lowest common ancestor L of X and R is a sequence and X comes before R
// (then X lies in an earlier child of L, since neither contains the other).
// L is found by climbing from R until a node's subtree [start, end) holds X;
// subtree ends are computed once, in one backward pass. A check costs at most
// the reader's depth (bounded by `--max-depth`), so checking a graph is linear
// in its size times that bound, never quadratic in the node count.

extension JobSpec {
    /// Applies the data-flow part of a submission to a graph the validator accepted: the job's `input`, each
    /// node's expressions, and the §6.2 ordering check of every `$ref` to a node.
    /// - Throws: `ValidationError` with an issue at each expression that reads a node it may not.
    mutating func attachDataflow(_ parsed: DataflowParser) throws {
        input = parsed.input
        if !parsed.dataflow.isEmpty {
            // One assignment: every change of `graph.nodes` rebuilds its id index.
            var nodes = graph.nodes
            for (index, flow) in parsed.dataflow where nodes.indices.contains(index) { nodes[index].dataflow = flow }
            graph.nodes = nodes
        }
        let issues = ReferenceCheck(graph: graph).issues(for: parsed.references)
        if !issues.isEmpty { throw ValidationError(issues: issues) }
    }
}

/// Checks `$ref`s to nodes against the tree's shape.
struct ReferenceCheck {
    let graph: JobGraph
    /// One past the last pre-order index of each node's subtree.
    private let ends: [Int]

    init(graph: JobGraph) {
        self.graph = graph
        var ends = Array(0..<graph.nodes.count).map { $0 + 1 }
        for i in graph.nodes.indices.reversed() {
            if let last = graph.nodes[i].children.last { ends[i] = ends[last] }
        }
        self.ends = ends
    }

    /// One issue per reference that breaks the rule, in document order.
    func issues(for references: [NodeReference]) -> [ValidationIssue] {
        guard !references.isEmpty else { return [] }
        var found: [(key: [Int], issue: ValidationIssue)] = []
        for reference in references {
            if let message = problem(reader: reference.reader, reads: reference.nodeID) {
                found.append((reference.key, ValidationIssue(pointer: reference.pointer, message: message)))
            }
            if found.count > IssueCollector.maxIssues { break }
        }
        return found.enumerated()
            .sorted { a, b in
                a.element.key.lexicographicallyPrecedes(b.element.key)
                    || (a.element.key == b.element.key && a.offset < b.offset)
            }
            .prefix(IssueCollector.maxIssues)
            .map(\.element.issue)
    }

    private func contains(_ a: Int, _ x: Int) -> Bool { a <= x && x < ends[a] }

    /// Why `reader` may not read node `id`, or `nil` when it may.
    func problem(reader r: Int, reads id: String) -> String? {
        guard graph.nodes.indices.contains(r) else { return nil }
        let readerID = graph.nodes[r].id
        let subject = "reads node \"\(id)\""
        guard let x = graph.index(ofNodeID: id) else {
            return "\(subject), which is not a node of this job"
        }
        // A template node exists only as its copies: only nodes of the same template (or copy) may read it.
        var up = graph.nodes[x].parent
        var climbed = 0
        while let a = up, climbed <= graph.nodes.count {
            if case .map = graph.nodes[a].kind, !contains(a, r), a != x {
                return "\(subject), which is part of the template of the map \"\(graph.nodes[a].id)\": it exists only "
                    + "as that map's copies, which only nodes of the same template can read"
            }
            up = graph.nodes[a].parent
            climbed += 1
        }
        if x == r {
            return "\(subject), which is this node itself: it has not settled while it runs (select applies a "
                + "pointer to its own result)"
        }
        if contains(r, x) {
            return "\(subject), which is inside node \"\(readerID)\": it runs as part of it, so it has not settled "
                + "when \"\(readerID)\" starts"
        }
        if contains(x, r) {
            return "\(subject), which contains node \"\(readerID)\": it settles only after \"\(readerID)\" does"
        }
        // Climb from the reader to the lowest ancestor whose subtree holds x.
        var child = r
        var ancestor = graph.nodes[r].parent
        var steps = 0
        while let a = ancestor, !contains(a, x), steps <= graph.nodes.count {
            child = a
            ancestor = graph.nodes[a].parent
            steps += 1
        }
        guard let lca = ancestor else { return "\(subject), which is not in the same tree" }
        let lcaNode = graph.nodes[lca]
        switch lcaNode.kind {
        case .sequence:
            if x < child { return nil }
            return "\(subject), which comes after node \"\(readerID)\" in the sequence \"\(lcaNode.id)\": it has not "
                + "settled when \"\(readerID)\" starts"
        case .list, .map:
            return "\(subject), which runs alongside node \"\(readerID)\" in the list \"\(lcaNode.id)\": it may not "
                + "have settled when \"\(readerID)\" starts (read it from a node after the list, inside a sequence)"
        case .fetch:
            return "\(subject), which may not have settled when \"\(readerID)\" starts"
        }
    }
}
