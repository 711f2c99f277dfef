// A running `map` node (API.md §7.1). When it starts it resolves its items,
// appends one copy of its template per item to the graph, and hands the
// copies and the items to the store; only once the items are committed does
// any copy start, so a restart always finds the items the map made its copies
// from, and makes the same copies again (`Engine.rebuild`). From then on the
// map runs as a `list` over its copies, plus `tolerated_failures`.

extension JobRun {
    func startMap(_ i: Int, _ spec: MapSpec) -> Deferred {
        markRunning(i)
        if let roots = graph.expansions[i] {
            // Expanded before a restart: the copies resume like any other nodes, settled ones keep their results.
            let runner = MapRunner(run: self, map: i, spec: spec)
            runners[i] = runner
            runner.runCopies(roots)
            return runner.deferred
        }
        let mapID = graph.nodes[i].id
        let items: [JSONValue]
        switch resolveItems(i, spec) {
        case .failure(var error):
            error.node = mapID
            return Deferred.withError(error)
        case .success(.array(let elements)):
            items = elements
        case .success(let other):
            return Deferred.withError(
                NodeError(.refType, "items of map \(mapID) must be an array, not \(article(other))", node: mapID))
        }
        if items.count > spec.maxItems {
            return Deferred.withError(
                NodeError(
                    .tooManyItems, "map \(mapID) has \(items.count) items, more than its max_items of \(spec.maxItems)",
                    node: mapID))
        }
        let size = max(1, spec.template.nodes.count)
        let limit = engine.configuration.limits.maxNodes
        let room = max(0, limit - graph.nodes.count)
        if items.count * size > room {
            return Deferred.withError(
                NodeError(
                    .tooManyItems,
                    "map \(mapID) would make \(items.count) copies of \(size) nodes (\(items.count * size)), more than "
                        + "the \(room) that the limit of \(limit) nodes per job still allows", node: mapID))
        }
        if items.isEmpty { return Deferred.withResult(JSONValue.array([])) }

        let base = graph.nodes.count
        let (block, roots) = MapExpansion.copies(of: graph, map: i, spec: spec, items: items)
        let records = block.map { node in
            NodeRecord(
                jobID: id, id: node.id, parent: node.parent.map { $0 < base ? graph.nodes[$0].id : block[$0 - base].id },
                position: node.index, type: node.typeName)
        }
        graph.appendCopies(block, ofMap: i, roots: roots)
        nodes.append(contentsOf: records)
        deferreds.append(contentsOf: repeatElement(nil, count: block.count))
        record.progress.total += block.count
        record.progress.pending += block.count
        unsettledNodes += block.count
        engine.nodesAdded(block.count)
        engine.nodeRoom.take(block.count)
        roomHeld += block.count
        touch(i)

        let runner = MapRunner(run: self, map: i, spec: spec)
        runners[i] = runner
        let expansion = MapExpansionRecord(
            jobID: id, nodeID: mapID, firstPosition: base, items: .array(items), nodes: records)
        let engine = self.engine
        let written = Timestamp.monotonicMs()
        let jobID = id
        engine.store.expandMap(expansion) { [weak self] committed in
            // The runner is dropped when the map settles (cancelled meanwhile): then nothing is left to start.
            let run = self
            engine.logger.debug(
                "map expanded",
                ["job": .string(jobID), "node": .string(mapID), "copies": .int(roots.count),
                 "store_ms": .int(Int(Timestamp.monotonicMs() - written))])
            engine.queue.async { (run?.runners[i] as? MapRunner)?.stored(committed, roots: roots) }
        }
        return runner.deferred
    }

    /// The map's items. The scope borrows the graph and the node records only while this runs: were it still alive
    /// when the copies are appended, they would be copied whole.
    private func resolveItems(_ i: Int, _ spec: MapSpec) -> Result<JSONValue, NodeError> {
        if case .value(let items) = spec.items { return .success(items) }
        let scope = ExpressionScope(input: record.input, graph: graph, nodes: nodes, copy: graph.nodes[i].copy)
        return ExpressionResolver.value(spec.items, in: scope, place: "items")
    }
}

/// Copies of a map's template.
enum MapExpansion {
    /// One copy of `spec.template` per item, indexed from `graph.nodes.count` on, copy by copy, each in
    /// pre-order; and the index of each copy's root.
    static func copies(of graph: JobGraph, map i: Int, spec: MapSpec, items: [JSONValue]) -> ([GraphNode], [Int]) {
        let template = spec.template.nodes
        let size = template.count
        let base = graph.nodes.count
        let mapNode = graph.nodes[i]
        let rootDepth = template.first?.depth ?? 0
        var block: [GraphNode] = []
        block.reserveCapacity(items.count * size)
        var roots: [Int] = []
        roots.reserveCapacity(items.count)
        for (k, item) in items.enumerated() {
            let start = base + k * size
            let copyID = JobGraph.childID(mapNode.id, k)
            let copy = MapCopy(id: copyID, item: item, index: k, localIDs: spec.localIDs, outer: mapNode.copy)
            roots.append(start)
            for t in template {
                var node = t
                node.index = start + t.index
                node.id = t.id.isEmpty ? copyID : copyID + "." + t.id
                node.parent = t.parent.map { start + $0 } ?? i
                node.children = t.children.map { start + $0 }
                node.depth = mapNode.depth + 1 + (t.depth - rootDepth)
                node.copy = copy
                block.append(node)
            }
        }
        return (block, roots)
    }

    /// Makes again, in the order they were made, the expansions stored for a job being rebuilt after a restart.
    /// - Throws: `EngineError.invalidStoredJob` when one does not fit the graph.
    static func restore(_ expansions: [MapExpansionRecord], into graph: inout JobGraph) throws {
        for expansion in expansions {
            guard let i = graph.index(ofNodeID: expansion.nodeID), case .map(let spec) = graph.nodes[i].kind,
                case .array(let items) = expansion.items, graph.expansions[i] == nil
            else {
                throw EngineError.invalidStoredJob("the stored items of map \(expansion.nodeID) fit no map of the job")
            }
            guard graph.nodes.count == expansion.firstPosition else {
                throw EngineError.invalidStoredJob(
                    "the copies of map \(expansion.nodeID) begin at \(expansion.firstPosition), not \(graph.nodes.count)")
            }
            let (block, roots) = copies(of: graph, map: i, spec: spec, items: items)
            graph.appendCopies(block, ofMap: i, roots: roots)
        }
    }
}

/// Drives a started map: waits for its copies to be stored, then runs them as a list.
final class MapRunner {
    unowned let run: JobRun
    let map: Int
    let spec: MapSpec
    private(set) lazy var deferred = Deferred(canceller: forwardingCanceller(to: self) { $0.cancel($1) })
    /// The list over the copies, once they run.
    private var list: Deferred?
    private var window: StandIns?
    private var roots: [Int] = []
    private var children: [Deferred] = []
    private var failures: [NodeError] = []

    init(run: JobRun, map: Int, spec: MapSpec) {
        self.run = run
        self.map = map
        self.spec = spec
        _ = deferred
    }

    private var mapID: String { run.graph.nodes[map].id }

    /// The run stops: the list over the copies and its stand-ins hold each other until abandoned (`JobRun.stop`).
    func abandon() {
        list?.abandon()
    }

    /// The store answered the expansion's write; on the engine's queue.
    func stored(_ committed: Result<Void, StoreError>, roots: [Int]) {
        guard !run.stopping, !deferred.isCalled else { return }
        switch committed {
        case .success:
            runCopies(roots)
        case .failure(let error):
            for root in roots { run.endUnstarted(root, as: .cancelled) }
            _ = try? deferred.takeError(
                NodeError(.internal, "the copies of map \(mapID) could not be stored: \(error)", node: mapID))
        }
    }

    private func cancel(_ d: Deferred) {
        if let list {
            list.cancel()
        } else {
            // The copies are not stored yet: none has started.
            for root in run.graph.expansions[map] ?? [] { run.endUnstarted(root, as: .cancelled) }
        }
        if !d.isCalled { _ = try? d.takeError(Failure.cancellation()) }
    }

    /// Runs the copies as the children of a `list` with the map's options.
    func runCopies(_ roots: [Int]) {
        self.roots = roots
        let options = spec.options
        let window: StandIns
        if let limit = options.concurrency, limit < roots.count {
            window = ListWindow(run: run, children: roots, limit: limit)
        } else {
            window = StaggeredStart(run: run, children: roots)
        }
        self.window = window
        let children = window.placeholders
        self.children = children
        if let tolerated = spec.toleratedFailures {
            for (k, child) in children.enumerated() {
                child.both { [weak self] result in
                    if let self, let failure = Failure.from(result), !JobRun.isCancellation(failure) {
                        self.copyFailed(JobRun.nodeError(failure, node: self.run.graph.nodes[roots[k]].id), tolerated: tolerated)
                    }
                    return result
                }
            }
        }
        let list = run.combine(roots, children, options: options, id: mapID, noun: "copies")
        self.list = list
        list.both { [weak self] result in
            if let self, !self.deferred.isCalled {
                if let failure = Failure.from(result) {
                    _ = try? self.deferred.takeError(failure)
                } else {
                    _ = try? self.deferred.takeResult(result)
                }
            }
            return result
        }
    }

    private func copyFailed(_ error: NodeError, tolerated: Int) {
        guard !deferred.isCalled else { return }
        failures.append(error)
        guard failures.count > tolerated else { return }
        _ = try? deferred.takeError(
            NodeError(
                .tooManyFailures,
                "\(failures.count) copies of map \(mapID) failed, more than its tolerated_failures of \(tolerated)",
                node: mapID, errors: failures))
        if spec.options.cancelRemaining { run.cancelUnsettled(roots, children) }
    }
}

/// A map's copies without a `concurrency` bound, started a chunk per turn of the engine's queue: the fetch
/// queue runs between chunks, so the first copies' transfers begin without waiting for thousands of copies to
/// start. Until started, a copy stands in the list as a placeholder, as in a list with `concurrency`.
final class StaggeredStart: StandIns, @unchecked Sendable {
    // @unchecked: like the run's, every property is read and changed only on the engine's `queue`: it is made
    // there, and the one `@Sendable` closure that holds it (the next chunk's) runs on that queue too.
    static let chunk = 256

    override init(run: JobRun, children: [Int]) {
        super.init(run: run, children: children)
        startChunk()
    }

    private func startChunk() {
        let end = min(children.count, next + StaggeredStart.chunk)
        while next < end { startNext() }
        guard next < children.count else { return }
        // Holds itself until every copy has started, even once the map has settled (`cancel_remaining: false`).
        // The run is looked at through a weak reference: a job deleted meanwhile is gone (and stopped first).
        run.engine.queue.async { [weak owner = run, self] in
            if let owner, !owner.stopping { self.startChunk() }
        }
    }
}

extension Array where Element == NodeRecord {
    /// The records in tree order (API.md §2), when a map's copies, stored after the submitted nodes, put them
    /// out of it: each copy right after its map's earlier copies, before the map's next sibling. Records already
    /// in tree order (no map expanded) come back as they are; one pass over parent links either way.
    func inTreeOrder() -> [NodeRecord] {
        guard count > 1, contains(where: { $0.type == "map" }) else { return self }
        return treeOrder().map { self[$0] }
    }

    /// The indices of the records in tree order (as `inTreeOrder` puts them).
    func treeOrder() -> [Int] {
        guard count > 1, contains(where: { $0.type == "map" }) else { return Swift.Array(0..<count) }
        var children: [String: [Int]] = [:]
        for (k, record) in enumerated() where k > 0 {
            if let parent = record.parent { children[parent, default: []].append(k) }
        }
        var out: [Int] = []
        out.reserveCapacity(count)
        var stack: [Int] = [0]
        while let k = stack.popLast(), out.count < count {
            out.append(k)
            if let below = children[self[k].id] { stack.append(contentsOf: below.reversed()) }
        }
        // Nothing is lost if parent links were damaged: what the walk did not reach follows in stored order.
        if out.count < count {
            let reached = Set(out)
            out.append(contentsOf: indices.filter { !reached.contains($0) })
        }
        return out
    }
}
