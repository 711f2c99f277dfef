// Validation of a job submission (API.md §1.1–1.2): `JobSpec.parse` walks a
// `JSONValue` and either returns the flat pre-order graph or throws a
// `ValidationError` listing every problem with a JSON Pointer.
//
// Decisions where API.md is silent:
// - Every problem is reported, in document order (sorted by position in the
//   body, so a bad field written after `children` still comes after the
//   children's problems). At most 100 are collected; a 101st issue then says
//   so, at the pointer of the first problem left out.
// - A JSON `null` is never "absent": `"timeout_ms": null` is a wrong type.
//   Only `recover` and `json` take any value, `null` included.
// - A field given twice in one object is refused at the second ("duplicate
//   field"); `headers` may repeat a name, since HTTP allows repeated fields.
// - Unknown fields are refused, with a "did you mean" hint within edit
//   distance 2. A node whose `type` is missing or invalid gets only its
//   common fields checked, fields no type knows refused, and its `children`
//   still walked so their problems are reported too.
// - Default ids are the positional path (`root.1.0`) even under a node with
//   an explicit id. An id collision (explicit against explicit or default) is
//   reported at the later node in pre-order: at its `/id`, or at the node
//   itself when the later one is using its default id. A node whose explicit
//   id is refused takes no part in the uniqueness check.
// - Depth: only the first node deeper than `maxDepth` is reported, and no
//   node past the limit is looked into. Node count: the first node past
//   `maxNodes` in pre-order is reported and the walk stops. Nodes past the
//   depth limit are not counted.
// - `name` counts Unicode scalars (≤ 200); it may be empty.
// - `metadata` size is its compact JSON text (as stored), ≤ 16384 bytes.
// - URL: printable ASCII only (no raw non-ASCII, white space or control
//   characters), ≤ 8192 bytes, scheme http/https in any case, `//` authority
//   with a non-empty host (reg-name or bracketed IPv6), optional port
//   1–65535 (an empty port after `:` is refused); user info is allowed. Other schemes: "scheme must be http or https".
// - `headers`: names are RFC 9110 tokens; `Content-Length` and
//   `Transfer-Encoding` are refused (libcurl sets them from the body);
//   values may not hold CR, LF or NUL.
// - `body` and `json` both given: refused at the later one. `json: null`
//   sends the JSON text `null`. A `HEAD` with a body is refused (at the body).
// - `retries` on a non-idempotent request is accepted and kept; the engine
//   does not retry such requests (API.md: retries apply only to idempotent ones).
// - `concurrency`: 1 to 1,000,000 (API.md only says ≥ 1; a bound keeps it an Int).
// - Integers: a JSON number with an integral value (`1`, `1.0`, `1e2`);
//   `1.5`, `"1"`, `true` are refused with the same "must be an integer from
//   A to B" message (plus the type found when it is not a number).

/// One problem found in a submitted job.
public struct ValidationIssue: Equatable, Sendable, CustomStringConvertible {
    /// RFC 6901 JSON Pointer into the request body (`/graph/children/2/url`; `""` is the whole body).
    public var pointer: String
    /// What is wrong, without the location (`scheme must be http or https`).
    public var message: String

    /// An issue at `pointer`.
    public init(pointer: String, message: String) {
        self.pointer = pointer
        self.message = message
    }

    /// The pointer as a readable path for messages: `/graph/children/2/url` → `graph.children[2].url`,
    /// `""` → `body`.
    public var location: String {
        guard !pointer.isEmpty else { return "body" }
        var out = ""
        for raw in pointer.split(separator: "/", omittingEmptySubsequences: false).dropFirst() {
            let token = raw.replacingTilde()
            if !token.isEmpty, token.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
                out += "[\(token)]"
            } else {
                out += out.isEmpty ? token : ".\(token)"
            }
        }
        return out
    }

    /// `graph.children[2].url: scheme must be http or https` — the form API.md §3 shows.
    public var description: String { "\(location): \(message)" }
}

extension Substring {
    /// Undoes RFC 6901 escaping of one reference token.
    fileprivate func replacingTilde() -> String {
        guard contains("~") else { return String(self) }
        var out = ""
        var pendingTilde = false
        for c in self {
            if pendingTilde {
                out.append(c == "1" ? "/" : c == "0" ? "~" : c)
                pendingTilde = false
            } else if c == "~" {
                pendingTilde = true
            } else {
                out.append(c)
            }
        }
        return out
    }
}

/// Why a job submission was refused: every problem found, each with a JSON Pointer.
public struct ValidationError: Error, Equatable, Sendable, CustomStringConvertible {
    /// All problems, in document order; never empty.
    public var issues: [ValidationIssue]

    /// An error carrying `issues` (which should not be empty).
    public init(issues: [ValidationIssue]) {
        self.issues = issues
    }

    /// The first issue, which the API's single-error answer (`path`, `message`) reports.
    public var first: ValidationIssue { issues.first ?? ValidationIssue(pointer: "", message: "invalid job") }

    /// Every issue as `location: message`, joined with `; `.
    public var description: String { issues.map(\.description).joined(separator: "; ") }
}

/// How a `list` node combines its children (API.md §1.2, a `DeferredList`).
public struct ListOptions: Equatable, Sendable {
    /// Succeed with the first child result, as soon as one child succeeds.
    public var fireOnFirstResult: Bool
    /// Fail with the first child failure, as soon as one child fails.
    public var fireOnFirstError: Bool
    /// A failed child stands as `null` in the results array instead of its error entry.
    public var consumeErrors: Bool
    /// Once the list has fired early, cancel the children still running or pending.
    public var cancelRemaining: Bool
    /// At most this many children running at once; `nil` is unlimited.
    public var concurrency: Int?

    /// Options with the API's defaults.
    public init(
        fireOnFirstResult: Bool = false, fireOnFirstError: Bool = false, consumeErrors: Bool = false,
        cancelRemaining: Bool = true, concurrency: Int? = nil
    ) {
        self.fireOnFirstResult = fireOnFirstResult
        self.fireOnFirstError = fireOnFirstError
        self.consumeErrors = consumeErrors
        self.cancelRemaining = cancelRemaining
        self.concurrency = concurrency
    }
}

/// How a `sequence` node runs its children.
public struct SequenceOptions: Equatable, Sendable {
    /// Go on after a failed child instead of stopping.
    public var continueOnError: Bool

    /// Options with the API's defaults.
    public init(continueOnError: Bool = false) {
        self.continueOnError = continueOnError
    }
}

/// One validated node of a job's tree.
public struct GraphNode: Equatable, Sendable {
    /// What the node does.
    public enum Kind: Equatable, Sendable {
        case fetch(FetchRequest)
        case list(ListOptions)
        case sequence(SequenceOptions)
        /// A `list` over copies of a template, made when the node starts (API.md §7.1).
        indirect case map(MapSpec)
    }

    /// Position in the graph's pre-order (the root is 0).
    public var index: Int
    /// The explicit `id`, or the default path id (`root`, `root.0`, `root.1.0`).
    public var id: String
    /// Index of the parent; `nil` for the root.
    public var parent: Int?
    /// Indices of the children, in order.
    public var children: [Int]
    /// Nesting depth; the root is 1.
    public var depth: Int
    /// What the node does.
    public var kind: Kind
    /// The node fails with kind `timeout` if not settled in this many milliseconds.
    public var timeoutMs: Int?
    /// The value the node succeeds with if it fails; `nil` is no recovery, `.some(.null)` recovers with `null`.
    public var recover: JSONValue?
    /// What the node reads from earlier nodes and the job's input, and its `select` (API.md §6); `nil` for none.
    /// Kept in a box: most nodes have none, and a job of 100,000 fetches holds 100,000 nodes (the value is 168
    /// bytes; the node was 384 with it inline).
    public var dataflow: NodeDataflow? {
        get { dataflowBox?.value }
        set { dataflowBox = newValue.map(DataflowBox.init) }
    }
    private var dataflowBox: DataflowBox?
    /// For a node of a map's copy: the copy it belongs to (its item, index and ids); `nil` elsewhere.
    public var copy: MapCopy?

    /// A node's `dataflow`, shared by the copies of its graph; compared by value.
    private final class DataflowBox: Equatable, Sendable {
        let value: NodeDataflow
        init(_ value: NodeDataflow) { self.value = value }
        static func == (a: DataflowBox, b: DataflowBox) -> Bool { a === b || a.value == b.value }
    }

    /// A node; `children` are filled in as they are added.
    public init(
        index: Int, id: String, parent: Int?, children: [Int] = [], depth: Int, kind: Kind, timeoutMs: Int? = nil,
        recover: JSONValue? = nil
    ) {
        self.index = index
        self.id = id
        self.parent = parent
        self.children = children
        self.depth = depth
        self.kind = kind
        self.timeoutMs = timeoutMs
        self.recover = recover
    }

    /// The API's name of the node's type: `fetch`, `list` or `sequence`.
    public var typeName: String {
        switch kind {
        case .fetch: return "fetch"
        case .list: return "list"
        case .sequence: return "sequence"
        case .map: return "map"
        }
    }

    /// The fetch request, for a `fetch` node.
    public var fetchRequest: FetchRequest? {
        if case .fetch(let request) = kind { return request }
        return nil
    }
}

/// A job's tree of nodes, flattened in pre-order with the root first.
public struct JobGraph: Equatable, Sendable {
    /// The nodes in pre-order; `nodes[i].index == i`. A map's copies, made at run time, follow the submitted
    /// nodes, each copy in pre-order (`appendCopies`).
    public var nodes: [GraphNode] {
        get { storage }
        set {
            storage = newValue
            indexByID = JobGraph.makeIndex(storage)
            subtreeEnds = JobGraph.subtreeEnds(storage)
        }
    }
    private var storage: [GraphNode]
    /// The copy roots of each map expanded so far, by the map's index.
    public internal(set) var expansions: [Int: [Int]] = [:]
    private var indexByID: [String: Int]
    /// For each node, the index just past its subtree in pre-order.
    private var subtreeEnds: [Int]

    /// A graph of `nodes`, which must be in pre-order with the root first.
    public init(nodes: [GraphNode]) {
        self.storage = nodes
        self.indexByID = JobGraph.makeIndex(nodes)
        self.subtreeEnds = JobGraph.subtreeEnds(nodes)
    }

    /// The graph of no nodes: what a `MapSpec` holds until its template is read. Made once, because making one
    /// allocates its id index, and the validator starts a `MapSpec` for every node it reads.
    public static let empty = JobGraph(nodes: [])

    /// A graph whose id index the validator built as it went: each id to the first node that has it.
    init(nodes: [GraphNode], indexByID: [String: Int]) {
        self.storage = nodes
        self.indexByID = indexByID
        self.subtreeEnds = JobGraph.subtreeEnds(nodes)
    }

    /// The root node. A graph always has one; an empty graph (never produced by `JobSpec.parse`) yields a
    /// placeholder sequence node.
    public var root: GraphNode {
        nodes.first ?? GraphNode(index: 0, id: "root", parent: nil, depth: 1, kind: .sequence(SequenceOptions()))
    }

    /// The index of the node with id `id`, if there is one.
    public func index(ofNodeID id: String) -> Int? { indexByID[id] }

    /// The node with id `id`, if there is one.
    public func node(withID id: String) -> GraphNode? { indexByID[id].map { nodes[$0] } }

    /// Indices of the nodes below `index` (not including it), in pre-order.
    public func descendants(of index: Int) -> Range<Int> {
        guard subtreeEnds.indices.contains(index) else { return 0..<0 }
        return (index + 1)..<subtreeEnds[index]
    }

    /// Graphs are equal when their nodes are; the id index is derived from them.
    public static func == (a: JobGraph, b: JobGraph) -> Bool { a.nodes == b.nodes }

    /// Adds a map's copies after the nodes there are: `block` holds whole copies, each in pre-order, with indices
    /// from `nodes.count` on. Costs the size of the block, not of the graph, so expanding stays linear.
    mutating func appendCopies(_ block: [GraphNode], ofMap map: Int, roots: [Int]) {
        let base = storage.count
        storage.append(contentsOf: block)
        indexByID.reserveCapacity(storage.count)
        for node in block where indexByID[node.id] == nil { indexByID[node.id] = node.index }
        for end in JobGraph.subtreeEnds(block) { subtreeEnds.append(base + end) }
        expansions[map] = roots
    }

    private static func makeIndex(_ nodes: [GraphNode]) -> [String: Int] {
        var index: [String: Int] = [:]
        index.reserveCapacity(nodes.count)
        for node in nodes where index[node.id] == nil { index[node.id] = node.index }
        return index
    }

    private static func subtreeEnds(_ nodes: [GraphNode]) -> [Int] {
        // In pre-order a subtree ends at the first later node that is not deeper; each node is opened and closed once.
        var ends = Array(repeating: nodes.count, count: nodes.count)
        var open: [Int] = []
        for i in nodes.indices {
            while let top = open.last, nodes[top].depth >= nodes[i].depth {
                ends[top] = i
                open.removeLast()
            }
            open.append(i)
        }
        return ends
    }
}

extension JobGraph {
    /// The rows of a job's nodes as they are before anything ran: all pending, in pre-order.
    func pendingNodeRecords(jobID: String) -> [NodeRecord] {
        nodes.map { node in
            NodeRecord(
                jobID: jobID, id: node.id, parent: node.parent.map { nodes[$0].id }, position: node.index,
                type: node.typeName)
        }
    }
}

/// A validated `POST /v1/jobs` body (API.md §1.1).
public struct JobSpec: Equatable, Sendable {
    /// The job's label.
    public var name: String?
    /// The whole job fails with kind `timeout` if not settled by then.
    public var deadlineMs: Int?
    /// Stored and echoed back unchanged; always an object when present.
    public var metadata: JSONValue?
    /// The job's tree.
    public var graph: JobGraph
    /// The job's `input`, which nodes read as `/input` (API.md §6.1).
    public var input: JSONValue?
    /// `not_before` and the concurrency key (API.md §8).
    public var schedule = ScheduleOptions()
    /// Where the completion webhook goes (API.md §8 `notify`).
    public var notify: NotifyTarget? = nil

    /// A job spec from parts already validated.
    public init(name: String? = nil, deadlineMs: Int? = nil, metadata: JSONValue? = nil, graph: JobGraph) {
        self.name = name
        self.deadlineMs = deadlineMs
        self.metadata = metadata
        self.graph = graph
    }

    /// Validates a whole `POST /v1/jobs` body, reporting every problem found.
    ///
    /// Walks the graph with an explicit stack, so a body nested far deeper than `limits.maxDepth` is refused in
    /// time proportional to `maxDepth`, not to the input's depth.
    /// - Parameters:
    ///   - body: the parsed request body.
    ///   - limits: the server's node, depth and response size limits.
    /// - Returns: the job with its graph in pre-order.
    /// - Throws: `ValidationError` with every problem (at most 100, then one saying more were left out).
    public static func parse(_ body: JSONValue, limits: Limits = Limits()) throws -> JobSpec {
        var validator = GraphValidator(limits: limits)
        var dataflow = DataflowParser(limits: limits)
        let notify = NotifyParser.extract(body)
        for issue in notify.issues { validator.issues.add(issue.pointer, issue.message, key: issue.key) }
        dataflow.parse(notify.body)
        for issue in dataflow.issues { validator.issues.add(issue.pointer, issue.message, key: issue.key) }
        let scheduling = ScheduleOptions.take(from: dataflow.body, nowMs: Timestamp.nowMs())
        for issue in scheduling.issues { validator.issues.add(issue.pointer, issue.message, key: issue.key) }
        let spec = validator.validate(scheduling.body)
        if let error = validator.issues.finish() { throw error }
        guard var spec else { throw ValidationError(issues: [ValidationIssue(pointer: "", message: "invalid job")]) }
        spec.schedule = scheduling.options
        try spec.attachDataflow(dataflow)
        spec.notify = notify.target
        spec.graph = spec.graph.extractingTemplates()
        return spec
    }
}

extension ValidationIssue {
    /// `{"path": …, "message": …}`, one entry of the `issues` array in the 422 answer.
    public var jsonValue: JSONValue {
        .object(["path": .string(pointer), "message": .string(message)])
    }
}

extension ValidationError {
    /// The `422 invalid_graph` answer body of API.md §3: `message` and `path` from the first issue, and every
    /// issue under `issues`.
    public var responseBody: JSONValue {
        .object([
            "error": .object([
                "code": "invalid_graph",
                "message": .string(first.description),
                "path": .string(first.pointer),
                "issues": .array(issues.map(\.jsonValue)),
            ])
        ])
    }
}

extension JobGraph {
    /// The default id of child `position` of the node with id `parent`, and the id of a map's copy `position`:
    /// `parent.position`, written at once. Joined with `+` and `String(position)` it took 380 instructions a node
    /// more (three strings made, two appends), 5 % of validating a list of fetches (callgrind over ParseBench's
    /// lists).
    static func childID(_ parent: String, _ position: Int) -> String {
        var digits = 1
        var rest = position / 10
        while rest > 0 {
            digits += 1
            rest /= 10
        }
        var parent = parent
        return parent.withUTF8 { head in
            String(unsafeUninitializedCapacity: head.count + 1 + digits) { out in
                _ = out.initialize(from: head)
                out[head.count] = UInt8(ascii: ".")
                var value = position
                for k in stride(from: head.count + digits, to: head.count, by: -1) {
                    out[k] = UInt8(ascii: "0") + UInt8(value % 10)
                    value /= 10
                }
                return head.count + 1 + digits
            }
        }
    }
}
