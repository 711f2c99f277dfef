// Submit-time reading of API.md §6: `input`, `query`, `select` and the
// expressions of §6.2, wherever §6.3 lets them stand.
//
// It runs before `GraphValidator` and hands it the body with the new fields
// taken out and each expression replaced by what the validator expects there
// (a string, or the folded constant), so the validator keeps checking exactly
// the v1 fields. It walks the graph in the same pre-order, so node `k` of its
// `nodes` is node `k` of the validated graph whenever the graph is valid.
//
// Decisions where API.md is silent:
// - An object with a `$ref`, `$concat` or `$literal` member and any other
//   member (but `default` beside `$ref`) is refused, not taken as a literal:
//   `{"$literal": …}` is the way to send such an object.
// - `$concat` parts are strings or `$ref`s only; `$literal` in a string
//   position must hold a string, number or boolean (its JSON text).
// - `input` and `metadata` are data: expressions in them are not read, and
//   not refused.
// - A part built only from constants (`{"$concat": ["a", "b"]}`, `$literal`)
//   is folded at submit and checked there like a written value.
// - `query` names are non-empty strings; values are strings, numbers,
//   booleans or expressions (numbers keep their JSON text).

/// A `$ref` to a node, kept to check at submit that the node settles before its reader starts.
struct NodeReference: Equatable {
    /// Pre-order index of the node whose field holds the expression.
    var reader: Int
    /// JSON Pointer of the expression in the request body.
    var pointer: String
    /// Document position, for ordering issues.
    var key: [Int]
    /// The node read.
    var nodeID: String
}

/// An issue found by this pass, placed in document order like the validator's.
struct KeyedIssue {
    var pointer: String
    var message: String
    var key: [Int]
}

/// The new fields of a submitted body, read before the v1 validation.
struct DataflowParser {
    static let maxInputBytes = 64 * 1024
    static let urlPlaceholder = "http://expression.invalid/"
    static let forbiddenMessage =
        "an expression cannot stand here: $ref, $concat and $literal are read only in a fetch's url, headers values, "
        + "query values, body and json, in recover, and in a map's items"

    let limits: GraphLimits
    /// The body to hand to `GraphValidator`.
    private(set) var body: JSONValue = .null
    private(set) var issues: [KeyedIssue] = []
    private(set) var input: JSONValue?
    /// What each node reads or selects, by pre-order index; only nodes that have something.
    private(set) var dataflow: [Int: NodeDataflow] = [:]
    private(set) var references: [NodeReference] = []

    /// The node being read; set while its fields are parsed.
    private var reader = 0
    /// True while the node being read is inside a map's template, where `/item` and `/index` may be read.
    private var readerInTemplate = false

    init(limits: GraphLimits) {
        self.limits = limits
    }

    // MARK: - Top level

    /// Reads `body`; afterwards `body` is what the validator should see.
    mutating func parse(_ submitted: JSONValue) {
        body = submitted
        guard case .object(let members) = submitted else { return }
        var kept: [JSONMember] = []
        kept.reserveCapacity(members.count)
        var changed = false
        var sawInput = false
        for (position, member) in members.enumerated() {
            let pointer = "/" + JSONPointer.escape(member.key)
            let key = [position]
            switch member.key {
            case "input":
                changed = true
                if sawInput {
                    issue(pointer, "duplicate field", key)
                    continue
                }
                sawInput = true
                if let size = compactSize(member.value, limit: DataflowParser.maxInputBytes),
                    size <= DataflowParser.maxInputBytes
                {
                    input = member.value
                } else {
                    issue(pointer, "must be at most \(DataflowParser.maxInputBytes) bytes (64 KiB) as compact JSON", key)
                }
            case "graph":
                let graph = walkGraph(member.value, pointer: pointer, key: key)
                if graph.changed { changed = true }
                kept.append(JSONMember(member.key, graph.value))
            case "metadata":
                kept.append(member)
            default:
                scanForbidden(member.value, pointer, key)
                kept.append(member)
            }
        }
        if changed { body = .object(kept) }
    }

    // MARK: - The tree

    private struct Entry {
        var value: JSONValue
        /// The parent's entry, and this node's position among the parent's children (a template is 0).
        var parent: Int?
        var position: Int
        /// The node's members after this pass, when any changed.
        var members: [JSONMember]?
        /// Position of `children` among the members, and each walked child's (array position, entry).
        var childrenMember: Int?
        var children: [(position: Int, entry: Int)] = []
        /// The one child is a map's `template`.
        var childIsTemplate = false
    }

    private struct Frame {
        var value: JSONValue
        var depth: Int
        var parent: Int?
        var position: Int
        var inTemplate = false
    }

    /// The nodes walked so far, by pre-order index; a node's entry is made before its fields are read. A node's
    /// pointer and document key are spelled out from its entry and its parents' only when one of its fields needs
    /// them (`place(of:)`): most nodes have none, and a chain's pointers grow with its depth.
    private var entries: [Entry] = []
    private var graphPointer = ""
    private var graphKey: [Int] = []

    /// The JSON Pointer and document key of the node at pre-order `index`.
    private func place(of index: Int) -> (pointer: String, key: [Int]) {
        var chain: [Int] = []
        var next: Int? = index
        while let i = next {
            chain.append(i)
            next = entries[i].parent
        }
        var pointer = graphPointer
        var key = graphKey
        for i in chain.reversed() {
            guard let parent = entries[i].parent, let member = entries[parent].childrenMember else { continue }
            if entries[parent].childIsTemplate {
                pointer += "/template"
                key.append(member)
            } else {
                pointer += "/children/\(entries[i].position)"
                key += [member, entries[i].position]
            }
        }
        return (pointer, key)
    }

    /// Walks the nodes in the validator's pre-order and rebuilds the ones that changed, children first.
    private mutating func walkGraph(_ root: JSONValue, pointer: String, key: [Int]) -> (value: JSONValue, changed: Bool) {
        guard DataflowParser.mayHoldDataflow(root, limits: limits) else { return (root, false) }
        (entries, graphPointer, graphKey) = ([], pointer, key)
        // Kept only for the walk: the entries hold the submitted values.
        defer { entries = [] }
        var stack = [Frame(value: root, depth: 1, parent: nil, position: 0)]
        while let frame = stack.popLast() {
            // Past the limits the validator refuses the job and looks no further; neither does this pass.
            if frame.depth > limits.maxDepth { continue }
            if entries.count >= limits.maxNodes { break }
            let index = entries.count
            if let parent = frame.parent { entries[parent].children.append((frame.position, index)) }
            reader = index
            readerInTemplate = frame.inTemplate
            entries.append(Entry(value: frame.value, parent: frame.parent, position: frame.position))
            if case .object(let members) = frame.value {
                let result = node(members, index: index)
                entries[index].members = result.members
                if let template = result.template {
                    entries[index].childrenMember = template.member
                    entries[index].childIsTemplate = true
                    stack.append(Frame(value: template.value, depth: frame.depth + 1, parent: index, position: 0, inTemplate: true))
                } else if let children = result.children {
                    entries[index].childrenMember = children.member
                    // Only the nodes the validator will look at: it stops at the first past `maxNodes`.
                    let budget = max(0, limits.maxNodes - index - stack.count)
                    for position in children.elements.indices.prefix(budget).reversed() {
                        stack.append(
                            Frame(
                                value: children.elements[position], depth: frame.depth + 1, parent: index,
                                position: position, inTemplate: frame.inTemplate))
                    }
                }
            }
        }
        guard !entries.isEmpty else { return (root, false) }

        // Children come after their parent in pre-order, so a backward pass sees every child first.
        var changed = Array(repeating: false, count: entries.count)
        var finished = Array(repeating: JSONValue.null, count: entries.count)
        for i in entries.indices.reversed() {
            // An unchanged node is left as it is, and its parent keeps it where it was: only changed nodes are
            // copied out of the entries and into `finished`.
            let childChanged = entries[i].children.contains { changed[$0.entry] }
            guard entries[i].members != nil || childChanged else { continue }
            let entry = entries[i]
            guard case .object(let original) = entry.value else { continue }
            var members = entry.members ?? original
            if childChanged, entry.childIsTemplate, let child = entry.children.first,
                let k = members.firstIndex(where: { $0.key == "template" })
            {
                members[k].value = finished[child.entry]
            } else if childChanged, let member = entry.childrenMember,
                let k = members.firstIndex(where: { $0.key == "children" }), case .array(var elements) = original[member].value
            {
                for child in entry.children where changed[child.entry] { elements[child.position] = finished[child.entry] }
                members[k].value = .array(elements)
            }
            for child in entry.children where changed[child.entry] { finished[child.entry] = .null }
            changed[i] = true
            finished[i] = .object(members)
        }
        return changed[0] ? (finished[0], true) : (root, false)
    }

    /// Whether the graph may hold anything this pass reads, changes or refuses; `false` only when the walk would
    /// find nothing: every node an object whose members are scalars, none named `select`, `query` or `paginate` nor
    /// beginning with `$`, and arrays of nodes in `children`. Found without the walk's entries and pointers: for a
    /// list of 100,000 fetches the walk took about 45 ms of the submission, before the validator's own (`perf`).
    /// Anything else, and a graph past the limits, is left to the walk.
    static func mayHoldDataflow(_ root: JSONValue, limits: GraphLimits) -> Bool {
        var stack: [(nodes: [JSONValue], depth: Int)] = [([root], 1)]
        var count = 0
        while let (nodes, depth) = stack.popLast() {
            if depth > limits.maxDepth { return true }
            count += nodes.count
            if count > limits.maxNodes { return true }
            for node in nodes {
                guard case .object(let members) = node else { return true }
                for member in members {
                    switch member.value {
                    case .array(let children) where member.key == "children":
                        stack.append((children, depth + 1))
                    case .object, .array:
                        return true
                    default:
                        if member.key == "select" || member.key == "query" || member.key == "paginate"
                            || member.key.utf8.first == UInt8(ascii: "$")
                        {
                            return true
                        }
                    }
                }
            }
        }
        return false
    }

    /// Reads one node's new fields; returns its members when any changed, and its children to walk.
    private mutating func node(_ members: [JSONMember], index: Int)
        -> (members: [JSONMember]?, children: (member: Int, elements: [JSONValue])?, template: (member: Int, value: JSONValue)?)
    {
        if DataflowParser.isExpression(members) {
            let place = place(of: index)
            issue(place.pointer, "a node cannot be an expression", place.key)
            return (nil, nil, nil)
        }
        // The node's own pointer and key, spelled out for the first member that needs them.
        var spelled: (pointer: String, key: [Int])?
        let type = members.first(where: { $0.key == "type" })?.value.stringValue
        let isFetch = type == "fetch"
        var flow = NodeDataflow()
        // The members as this pass leaves them, made only once a member needs more than to be kept as it is (most
        // nodes have none such): until then `out` is empty, and stands for the members before `position`.
        var out: [JSONMember] = []
        var outStarted = false
        var changed = false
        var children: (member: Int, elements: [JSONValue])?
        var template: (member: Int, value: JSONValue)?
        let isMap = type == "map"
        var sawSelect = false
        var sawQuery = false
        var sawPaginate = false

        for (position, member) in members.enumerated() {
            let value = member.value
            // A string, number, boolean or null holds no expression, and but for these three keys is kept as it is,
            // without spelling out its pointer: most of a large job's members are such, and with `children` they
            // are all a chain of nodes has.
            switch value {
            case .array(let elements) where member.key == "children":
                // The children are walked as nodes of their own; only an expression in their place is refused here.
                if type != "fetch", children == nil { children = (position, elements) }
                if outStarted { out.append(member) }
                continue
            case .object, .array: break
            default:
                if member.key != "select", member.key != "query", member.key != "paginate" {
                    if outStarted { out.append(member) }
                    continue
                }
            }
            if !outStarted {
                out.reserveCapacity(members.count)
                out.append(contentsOf: members[..<position])
                outStarted = true
            }
            let base = spelled ?? place(of: index)
            spelled = base
            let pointer = base.pointer + "/" + JSONPointer.escape(member.key)
            let key = base.key + [position]
            switch member.key {
            case "select":
                changed = true
                if sawSelect {
                    issue(pointer, "duplicate field", key)
                    continue
                }
                sawSelect = true
                if let text = value.stringValue, let path = JSONPointerPath(text) {
                    flow.select = path
                } else {
                    issue(pointer, "must be a JSON Pointer (RFC 6901): \"\" or a path such as \"/body/items\"", key)
                }
                continue
            case "query" where isFetch:
                changed = true
                if sawQuery {
                    issue(pointer, "duplicate field", key)
                    continue
                }
                sawQuery = true
                flow.query = query(value, pointer, key)
                continue
            case "paginate" where isFetch:
                // API.md §7.2: taken out here, like `query`, so the v1 validator checks only v1 fields.
                changed = true
                if sawPaginate {
                    issue(pointer, "duplicate field", key)
                    continue
                }
                sawPaginate = true
                let method = members.last(where: { $0.key == "method" })?.value.stringValue ?? "GET"
                let (spec, found) = PaginateSpec.parse(value, pointer: pointer, key: key, method: method)
                issues += found
                flow.paginate = spec
                continue
            case "url" where isFetch:
                if case .object(let fields) = value {
                    changed = true
                    guard DataflowParser.isExpression(fields) else {
                        issue(pointer, "must be a string (an absolute http or https URL) or an expression", key)
                        out.append(JSONMember(member.key, .string(DataflowParser.urlPlaceholder)))
                        continue
                    }
                    let template = stringExpression(fields, pointer, key, scalars: true)
                    if let constant = template?.constant {
                        out.append(JSONMember(member.key, .string(constant)))
                    } else {
                        flow.url = template
                        out.append(JSONMember(member.key, .string(DataflowParser.urlPlaceholder)))
                    }
                    continue
                }
            case "headers" where isFetch:
                if case .object(let headers) = value {
                    if DataflowParser.isExpression(headers) {
                        issue(pointer, DataflowParser.forbiddenMessage, key)
                        continue
                    }
                    if let rewritten = self.headers(headers, pointer, key, into: &flow) {
                        changed = true
                        out.append(JSONMember(member.key, .object(rewritten)))
                        continue
                    }
                } else {
                    scanForbidden(value, pointer, key)
                }
            case "body" where isFetch:
                if case .object(let fields) = value, DataflowParser.isExpression(fields) {
                    changed = true
                    let template = stringExpression(fields, pointer, key, scalars: true)
                    if let constant = template?.constant {
                        out.append(JSONMember(member.key, .string(constant)))
                    } else {
                        flow.body = template
                        out.append(JSONMember(member.key, .string("")))
                    }
                    continue
                }
                scanForbidden(value, pointer, key)
            case "json" where isFetch, "recover":
                let (template, touched) = topTemplate(value, pointer, key)
                if touched {
                    changed = true
                    if let constant = template.constant {
                        out.append(JSONMember(member.key, constant))
                        continue
                    }
                    if member.key == "json" { flow.json = template } else { flow.recover = template }
                }
            case "items" where isMap:
                let (items, touched) = topTemplate(value, pointer, key)
                if touched {
                    changed = true
                    if let constant = items.constant {
                        out.append(JSONMember(member.key, constant))
                    } else {
                        // The validator sees an array; the items are known only when the map starts.
                        flow.items = items
                        out.append(JSONMember(member.key, .array([])))
                    }
                    continue
                }
            case "template" where isMap:
                if case .object(let fields) = value {
                    if DataflowParser.isExpression(fields) {
                        issue(pointer, DataflowParser.forbiddenMessage, key)
                    } else if template == nil {
                        template = (position, value)
                    }
                }
            case "children":
                // An array was taken above.
                if case .object(let fields) = value, DataflowParser.isExpression(fields) {
                    issue(pointer, DataflowParser.forbiddenMessage, key)
                }
            default:
                scanForbidden(value, pointer, key)
            }
            out.append(member)
        }
        if !flow.isEmpty { dataflow[index] = flow }
        return (changed ? out : nil, children, template)
    }

    /// The headers with expressions replaced for the validator; `nil` when none has one.
    private mutating func headers(
        _ headers: [JSONMember], _ pointer: String, _ key: [Int], into flow: inout NodeDataflow
    ) -> [JSONMember]? {
        var templates: [NamedTemplate] = []
        var out = headers
        var changed = false
        var built = false
        for (position, header) in headers.enumerated() {
            let headerPointer = pointer + "/" + JSONPointer.escape(header.key)
            let headerKey = key + [position]
            switch header.value {
            case .string(let s):
                templates.append(NamedTemplate(name: header.key, value: StringTemplate([.text(s)])))
            case .object(let fields) where DataflowParser.isExpression(fields):
                changed = true
                guard let template = stringExpression(fields, headerPointer, headerKey, scalars: true) else {
                    out[position].value = .string("")
                    continue
                }
                if let constant = template.constant {
                    out[position].value = .string(constant)
                    templates.append(NamedTemplate(name: header.key, value: StringTemplate([.text(constant)])))
                } else {
                    // The validator checks the name; the value is checked for CR, LF and NUL once resolved.
                    out[position].value = .string("")
                    templates.append(NamedTemplate(name: header.key, value: template))
                    built = true
                }
            default:
                scanForbidden(header.value, headerPointer, headerKey)
            }
        }
        if built { flow.headers = templates }
        return changed ? out : nil
    }

    private mutating func query(_ value: JSONValue, _ pointer: String, _ key: [Int]) -> [NamedTemplate] {
        guard case .object(let members) = value, !DataflowParser.isExpression(members) else {
            if case .object = value {
                issue(pointer, DataflowParser.forbiddenMessage, key)
            } else {
                issue(pointer, "must be an object of parameter name to string, number, boolean or expression", key)
            }
            return []
        }
        var parameters: [NamedTemplate] = []
        for (position, member) in members.enumerated() {
            let memberPointer = pointer + "/" + JSONPointer.escape(member.key)
            let memberKey = key + [position]
            if member.key.isEmpty {
                issue(memberPointer, "a query parameter name must not be empty", memberKey)
                continue
            }
            switch member.value {
            case .string(let s):
                parameters.append(NamedTemplate(name: member.key, value: StringTemplate([.text(s)])))
            case .number(let text):
                parameters.append(NamedTemplate(name: member.key, value: StringTemplate([.text(text)])))
            case .bool(let b):
                parameters.append(NamedTemplate(name: member.key, value: StringTemplate([.text(b ? "true" : "false")])))
            case .object(let fields) where DataflowParser.isExpression(fields):
                if let template = stringExpression(fields, memberPointer, memberKey, scalars: true) {
                    parameters.append(NamedTemplate(name: member.key, value: template))
                }
            default:
                issue(memberPointer, "must be a string, number, boolean or expression, not \(article(member.value))", memberKey)
            }
        }
        return parameters
    }

    // MARK: - Expressions

    /// True for an object read as an expression: one with a `$ref`, `$concat` or `$literal` member.
    static func isExpression(_ members: [JSONMember]) -> Bool {
        members.contains { $0.key == "$ref" || $0.key == "$concat" || $0.key == "$literal" }
    }

    /// Which expression an object is, once its members are checked; `nil` after an issue.
    private enum Form {
        case ref(JSONValue, defaultValue: JSONValue?, position: Int)
        case concat(JSONValue, position: Int)
        case literal(JSONValue)
    }

    private mutating func form(_ members: [JSONMember], _ pointer: String, _ key: [Int]) -> Form? {
        let operators = members.filter { $0.key == "$ref" || $0.key == "$concat" || $0.key == "$literal" }
        guard operators.count == 1, let op = operators.first else {
            issue(
                pointer,
                "an expression has exactly one of $ref, $concat, $literal (to send such an object as is, wrap it in "
                    + "{\"$literal\": …})", key)
            return nil
        }
        let allowed: Set<String> = op.key == "$ref" ? ["$ref", "default"] : [op.key]
        var seen = Set<String>()
        for member in members {
            guard allowed.contains(member.key) else {
                let beside = op.key == "$ref" ? "only \"default\" may stand beside $ref" : "\(op.key) stands alone"
                issue(
                    pointer,
                    "unexpected member \"\(member.key)\" in a \(op.key) expression: \(beside) (wrap an object that "
                        + "is meant as is in {\"$literal\": …})", key)
                return nil
            }
            guard seen.insert(member.key).inserted else {
                issue(pointer, "duplicate member \"\(member.key)\" in a \(op.key) expression", key)
                return nil
            }
        }
        let position = members.firstIndex(where: { $0.key == op.key }) ?? 0
        switch op.key {
        case "$ref":
            return .ref(op.value, defaultValue: members.first(where: { $0.key == "default" })?.value, position: position)
        case "$concat":
            return .concat(op.value, position: position)
        default:
            return .literal(op.value)
        }
    }

    /// A `$ref` whose pointer is checked: RFC 6901, reading `/input…` or `/nodes/<id>…`.
    private mutating func scopeRef(_ value: JSONValue, defaultValue: JSONValue?, _ pointer: String, _ key: [Int])
        -> ScopeRef?
    {
        guard case .string(let text) = value else {
            issue(pointer, "$ref must be a string: a JSON Pointer such as \"/nodes/login/result/body\"", key)
            return nil
        }
        guard let path = JSONPointerPath(text) else {
            issue(
                pointer,
                "$ref \"\(text)\" is not a valid JSON Pointer (RFC 6901): it starts with / and ~ is written ~0 or ~1",
                key)
            return nil
        }
        switch path.tokens.first {
        case "input":
            break
        case "nodes":
            guard path.tokens.count >= 2, !path.tokens[1].isEmpty else {
                issue(pointer, "$ref \"\(text)\" must name a node: /nodes/<id>/…", key)
                return nil
            }
            references.append(NodeReference(reader: reader, pointer: pointer, key: key, nodeID: path.tokens[1]))
        case "item" where readerInTemplate, "index" where readerInTemplate:
            break
        case "item", "index":
            issue(
                pointer,
                "$ref \"\(text)\" reads /\(path.tokens[0]), which exists only inside a map template; this is outside "
                    + "a map template", key)
            return nil
        default:
            issue(pointer, "$ref \"\(text)\" must start with /input or /nodes/<id>", key)
            return nil
        }
        return ScopeRef(pointer: path, defaultValue: defaultValue)
    }

    /// The parts of a `$concat`: strings and `$ref`s.
    private mutating func concat(_ value: JSONValue, _ pointer: String, _ key: [Int]) -> StringTemplate? {
        guard case .array(let elements) = value else {
            issue(pointer, "$concat must be an array of strings and {\"$ref\": …} parts", key)
            return nil
        }
        var parts: [StringPart] = []
        var ok = true
        for (position, element) in elements.enumerated() {
            let partPointer = pointer + "/\(position)"
            let partKey = key + [position]
            switch element {
            case .string(let s):
                parts.append(.text(s))
            case .object(let fields) where fields.contains(where: { $0.key == "$ref" }):
                if case .ref(let refValue, let defaultValue, _)? = form(fields, partPointer, partKey),
                    let ref = scopeRef(refValue, defaultValue: defaultValue, partPointer, partKey)
                {
                    parts.append(.ref(ref))
                } else {
                    ok = false
                }
            default:
                issue(partPointer, "a $concat part must be a string or a {\"$ref\": …}, not \(article(element))", partKey)
                ok = false
            }
        }
        return ok ? StringTemplate(parts) : nil
    }

    /// An expression standing where a string is needed (url, header, query value, body).
    private mutating func stringExpression(_ members: [JSONMember], _ pointer: String, _ key: [Int], scalars: Bool)
        -> StringTemplate?
    {
        switch form(members, pointer, key) {
        case .ref(let value, let defaultValue, _)?:
            return scopeRef(value, defaultValue: defaultValue, pointer, key).map { StringTemplate([.ref($0)]) }
        case .concat(let value, let position)?:
            return concat(value, pointer + "/$concat", key + [position])
        case .literal(let value)?:
            switch value {
            case .string(let s): return StringTemplate([.text(s)])
            case .number(let text) where scalars: return StringTemplate([.text(text)])
            case .bool(let b) where scalars: return StringTemplate([.text(b ? "true" : "false")])
            default:
                issue(pointer, "$literal here must hold a string, number or boolean, not \(article(value))", key)
                return nil
            }
        case nil:
            return nil
        }
    }

    /// A value where expressions may stand anywhere (`json`, `recover`); `touched` when it held any.
    private mutating func valueTemplate(_ value: JSONValue, _ pointer: String, _ key: [Int])
        -> (template: ValueTemplate, touched: Bool)
    {
        switch value {
        case .object(let members):
            if DataflowParser.isExpression(members) {
                switch form(members, pointer, key) {
                case .ref(let refValue, let defaultValue, _)?:
                    if let ref = scopeRef(refValue, defaultValue: defaultValue, pointer, key) { return (.ref(ref), true) }
                case .concat(let parts, let position)?:
                    if let template = concat(parts, pointer + "/$concat", key + [position]) {
                        if let constant = template.constant { return (.value(.string(constant)), true) }
                        return (.concat(template), true)
                    }
                case .literal(let inner)?:
                    return (.value(inner), true)
                case nil:
                    break
                }
                return (.value(.null), true)
            }
            var templates: [TemplateMember] = []
            var touched = false
            for (position, member) in members.enumerated() {
                let (template, t) = valueTemplate(member.value, pointer + "/" + JSONPointer.escape(member.key), key + [position])
                touched = touched || t
                templates.append(TemplateMember(member.key, template))
            }
            guard touched else { return (.value(value), false) }
            if templates.allSatisfy({ $0.value.constant != nil }) {
                return (.value(.object(templates.map { JSONMember($0.key, $0.value.constant ?? .null) })), true)
            }
            return (.object(templates), true)
        case .array(let elements):
            var templates: [ValueTemplate] = []
            var touched = false
            for (position, element) in elements.enumerated() {
                let (template, t) = valueTemplate(element, pointer + "/\(position)", key + [position])
                touched = touched || t
                templates.append(template)
            }
            guard touched else { return (.value(value), false) }
            if templates.allSatisfy({ $0.constant != nil }) {
                return (.value(.array(templates.map { $0.constant ?? .null })), true)
            }
            return (.array(templates), true)
        default:
            return (.value(value), false)
        }
    }

    /// Refuses every expression inside a field where none may stand. Iterative: a value may nest as deep as the
    /// request parser allows, far past what the stack of a request's thread holds.
    private mutating func scanForbidden(_ value: JSONValue, _ pointer: String, _ key: [Int]) {
        var stack: [(value: JSONValue, pointer: String, key: [Int])] = [(value, pointer, key)]
        while let (value, pointer, key) = stack.popLast() {
            switch value {
            case .object(let members):
                if DataflowParser.isExpression(members) {
                    issue(pointer, DataflowParser.forbiddenMessage, key)
                    continue
                }
                for (position, member) in members.enumerated().reversed() {
                    stack.append((member.value, pointer + "/" + JSONPointer.escape(member.key), key + [position]))
                }
            case .array(let elements):
                for (position, element) in elements.enumerated().reversed() {
                    stack.append((element, pointer + "/\(position)", key + [position]))
                }
            default:
                continue
            }
        }
    }

    /// How many levels `value` nests below itself, and whether it holds an expression; iterative.
    static func shape(_ value: JSONValue) -> (depth: Int, hasExpression: Bool) {
        var deepest = 0
        var hasExpression = false
        var stack: [(JSONValue, Int)] = [(value, 0)]
        while let (value, depth) = stack.popLast() {
            deepest = max(deepest, depth)
            switch value {
            case .object(let members):
                if isExpression(members) { hasExpression = true }
                for member in members { stack.append((member.value, depth + 1)) }
            case .array(let elements):
                for element in elements { stack.append((element, depth + 1)) }
            default:
                continue
            }
        }
        return (deepest, hasExpression)
    }

    /// How deep a `json` or `recover` value holding expressions may nest: its template is built recursively.
    static let maxTemplateDepth = 128

    /// `valueTemplate` for a whole `json` or `recover` value: one without expressions is kept as it is, whatever
    /// its depth; one with expressions may nest at most `maxTemplateDepth` levels.
    private mutating func topTemplate(_ value: JSONValue, _ pointer: String, _ key: [Int])
        -> (template: ValueTemplate, touched: Bool)
    {
        let shape = DataflowParser.shape(value)
        guard shape.hasExpression else { return (.value(value), false) }
        guard shape.depth <= DataflowParser.maxTemplateDepth else {
            issue(
                pointer,
                "a value holding expressions may nest at most \(DataflowParser.maxTemplateDepth) levels, not \(shape.depth)",
                key)
            return (.value(.null), true)
        }
        return valueTemplate(value, pointer, key)
    }

    private mutating func issue(_ pointer: String, _ message: String, _ key: [Int]) {
        issues.append(KeyedIssue(pointer: pointer, message: message, key: key))
    }
}

/// `an object`, `a string`…
func article(_ value: JSONValue) -> String {
    let name = value.typeName
    return name.first.map { "aeiou".contains($0) } == true ? "an \(name)" : "a \(name)"
}
