// The `map` node of API.md §7.1: a `list` whose children are copies of a
// template, one per item of an array found when the node starts.
//
// At submit the template is validated as a node in the tree (so every issue
// has its JSON Pointer and the §6.2 ordering rule covers it); afterwards it is
// taken out of the job's graph into the map's `MapSpec`, so that the graph
// holds only nodes that run. When the map starts, `MapExpansion` copies the
// template once per item and appends the copies to the graph.
//
// Decisions where API.md is silent:
// - Inside a template, `/nodes/<t>` names a template node by its explicit id;
//   template nodes without an id cannot be read.
// - An explicit id inside a template may not be made only of digits and dots:
//   it could be the path id of another template node in the same copy.
// - Template nodes count towards `--max-nodes` at submit like other nodes;
//   at run time a map makes `items × template size` nodes, which must fit in
//   what `--max-nodes` still allows, else `too_many_items`.

/// How a `map` node runs.
public struct MapSpec: Equatable, Sendable {
    /// The array, or the expression that gives it.
    public var items: ValueTemplate
    /// The template, its root at index 0, in pre-order; each node's `id` is its suffix in a copy: `""` for the
    /// root, else its explicit id or its path below the root (`0`, `1.0`).
    public var template: JobGraph
    /// Template nodes with an explicit id: id → suffix in a copy (`""` for the root).
    public var localIDs: [String: String]
    /// The list rules the copies follow.
    public var options: ListOptions
    /// More items than this fail the map with `too_many_items`.
    public var maxItems: Int
    /// More failed copies than this fail the map with `too_many_failures`; `nil` is no bound.
    public var toleratedFailures: Int?

    public static let defaultMaxItems = 1000

    public init(
        items: ValueTemplate = .value(.array([])), template: JobGraph = .empty,
        localIDs: [String: String] = [:], options: ListOptions = ListOptions(), maxItems: Int = MapSpec.defaultMaxItems,
        toleratedFailures: Int? = nil
    ) {
        self.items = items
        self.template = template
        self.localIDs = localIDs
        self.options = options
        self.maxItems = maxItems
        self.toleratedFailures = toleratedFailures
    }
}

/// One copy of a map's template: what its nodes read as `/item` and `/index`, and how their template ids map to
/// the copy's ids. Shared by every node of the copy; immutable.
public final class MapCopy: Equatable, Sendable {
    /// The copy root's id, `<map id>.<index>`.
    public let id: String
    public let item: JSONValue
    public let index: Int
    /// The template's explicit ids → suffix (shared by all copies of one map).
    public let localIDs: [String: String]
    /// The copy of an enclosing map, when this map is itself inside a template.
    public let outer: MapCopy?

    init(id: String, item: JSONValue, index: Int, localIDs: [String: String], outer: MapCopy?) {
        self.id = id
        self.item = item
        self.index = index
        self.localIDs = localIDs
        self.outer = outer
    }

    /// The id in this copy (or an enclosing one) of the template node `templateID`, if it is one.
    func copyID(of templateID: String) -> String? {
        var copy: MapCopy? = self
        while let c = copy {
            if let suffix = c.localIDs[templateID] { return suffix.isEmpty ? c.id : c.id + "." + suffix }
            copy = c.outer
        }
        return nil
    }

    public static func == (a: MapCopy, b: MapCopy) -> Bool { a === b }
}

extension JobGraph {
    /// Whether any node is a `map`.
    var hasMaps: Bool {
        nodes.contains(where: { if case .map = $0.kind { return true } else { return false } })
    }

    /// The graph with each map's template taken out into its `MapSpec` (recursively, for maps inside templates);
    /// in the graph a map has the template's root as its only child, as the validator built it.
    func extractingTemplates() -> JobGraph {
        guard hasMaps else { return self }
        return JobGraph(nodes: extract(root: 0, suffixes: nil))
    }

    /// The nodes of the subtree at `root`, renumbered from 0, templates taken out. `suffixes` set: the subtree is
    /// a template, and each node's id becomes its suffix (path below the root, or its explicit id).
    private func extract(root: Int, suffixes: [Int: String]?) -> [GraphNode] {
        var out: [GraphNode] = []
        var newIndex: [Int: Int] = [:]
        var j = root
        let end = descendants(of: root).upperBound
        while j < end {
            var node = nodes[j]
            let k = out.count
            newIndex[j] = k
            node.index = k
            node.parent = j == root ? nil : node.parent.flatMap { newIndex[$0] }
            node.children = []
            if let suffixes { node.id = suffixes[j] ?? node.id }
            if let p = node.parent { out[p].children.append(k) }
            if case .map(var spec) = node.kind, let templateRoot = nodes[j].children.first {
                if let items = node.dataflow?.items { spec.items = items }
                let (template, local) = templateOf(templateRoot)
                spec.template = JobGraph(nodes: template)
                spec.localIDs = local
                node.kind = .map(spec)
                out.append(node)
                j = descendants(of: templateRoot).upperBound
                continue
            }
            out.append(node)
            j += 1
        }
        return out
    }

    /// The template rooted at `templateRoot`, with each node's id its suffix in a copy, and its explicit ids.
    private func templateOf(_ templateRoot: Int) -> ([GraphNode], [String: String]) {
        var suffixes: [Int: String] = [templateRoot: ""]
        var local: [String: String] = [:]
        let range = descendants(of: templateRoot)
        // Explicit ids are those the validator did not make: a default id always holds `#` (see GraphValidator).
        if !nodes[templateRoot].id.contains("#") { local[nodes[templateRoot].id] = "" }
        var paths: [Int: String] = [templateRoot: ""]
        for j in [templateRoot] + Array(range) {
            let parentPath = paths[j] ?? ""
            for (position, child) in nodes[j].children.enumerated() {
                paths[child] = parentPath.isEmpty ? "\(position)" : parentPath + ".\(position)"
            }
            guard j != templateRoot else { continue }
            if nodes[j].id.contains("#") {
                suffixes[j] = paths[j] ?? ""
            } else {
                suffixes[j] = nodes[j].id
                local[nodes[j].id] = nodes[j].id
            }
        }
        return (extract(root: templateRoot, suffixes: suffixes), local)
    }
}

