/// Where an issue is: a short path below a node's place (or below the body, when `place` is `nil`).
///
/// Nothing is spelled out until an issue is kept: a node's pointer and document position grow with its depth, and
/// even a member's pointer token costs a string per field, so a spot holds only the names and positions, and the
/// collector writes the pointer and the key for the (at most 101) issues it keeps.
struct Spot {
    /// One step down: into an object's member (`name`, at `position` among the members, or `nil` for a member
    /// that is missing and so sorts with its object), or into an array's element (`name` is `nil`).
    struct Step {
        var name: String?
        var position: Int?
    }

    /// The node's entry in `IssueCollector.places`; `nil` for the body itself.
    var place: Int?
    // Two steps cover every spot the validator names below a node (`/headers/X`, `/accept_status/3`,
    // `/children/3`); deeper ones go to `more`, which stays empty (and so unallocated) otherwise.
    private var first: Step?
    private var second: Step?
    private var more: [Step] = []

    /// The body itself.
    init() {}

    /// A node's own place.
    init(place: Int) {
        self.place = place
    }

    /// Element `element` of the array in member `name`, at `position`, of the node at `place`: where a child stands
    /// below its parent (`/children/3`), made at once rather than a step at a time, which copied the spot twice.
    init(place: Int, member name: String, at position: Int, element: Int) {
        self.place = place
        first = Step(name: name, position: position)
        second = Step(name: nil, position: element)
    }

    private func appending(_ step: Step) -> Spot {
        var spot = self
        if spot.first == nil {
            spot.first = step
        } else if spot.second == nil {
            spot.second = step
        } else {
            spot.more.append(step)
        }
        return spot
    }

    /// The member named `name`, at `position` among its object's members.
    func member(_ name: String, at position: Int) -> Spot { appending(Step(name: name, position: position)) }

    /// The member named `name`, which is absent: `is required` sorts with the object it is missing from.
    func missing(_ name: String) -> Spot { appending(Step(name: name, position: nil)) }

    /// An array's element.
    func element(_ position: Int) -> Spot { appending(Step(name: nil, position: position)) }

    /// The steps in order.
    var steps: [Step] { [first, second].compactMap { $0 } + more }
}

/// Collects issues, each with a key giving its position in the document so that
/// the final list is in document order even though nodes are checked before
/// fields that follow their `children`.
struct IssueCollector {
    static let maxIssues = 100

    /// Each node's place: where it is below its parent's place (`/children/3`).
    private var places: [Spot] = []
    private var collected: [(key: [Int], issue: ValidationIssue)] = []
    private var firstDropped: ValidationIssue?

    /// True once more issues were found than are reported; walking can stop.
    var isFull: Bool { firstDropped != nil }
    var isEmpty: Bool { collected.isEmpty }

    /// Records a node's place: `spot`, whose own place is the parent's. Returns the new place.
    mutating func addPlace(_ spot: Spot) -> Int {
        places.append(spot)
        return places.count - 1
    }

    /// Every step from the body to `spot`.
    private func path(_ spot: Spot) -> [Spot.Step] {
        var spots = [spot]
        var place = spot.place
        while let p = place {
            spots.append(places[p])
            place = places[p].place
        }
        return spots.reversed().flatMap(\.steps)
    }

    /// The full JSON Pointer of `spot`.
    func pointer(_ spot: Spot) -> String {
        JSONPointer.make(path(spot).map { $0.name ?? String($0.position ?? 0) })
    }

    /// The full document position of `spot`: the position of each member and element on the way.
    func key(_ spot: Spot) -> [Int] {
        path(spot).compactMap(\.position)
    }

    mutating func add(_ spot: Spot, _ message: String) {
        guard firstDropped == nil else { return }
        add(pointer(spot), message, key: key(spot))
    }

    /// An issue whose pointer and document position were spelled out already (the data-flow checks' issues).
    mutating func add(_ pointer: String, _ message: String, key: [Int]) {
        guard firstDropped == nil else { return }
        if collected.count >= IssueCollector.maxIssues {
            firstDropped = ValidationIssue(pointer: pointer, message: message)
            return
        }
        collected.append((key, ValidationIssue(pointer: pointer, message: message)))
    }

    /// The error to throw, or `nil` when nothing was wrong.
    func finish() -> ValidationError? {
        guard !collected.isEmpty else { return nil }
        // Stable sort by document position: equal keys keep the order found.
        let ordered = collected.enumerated().sorted { a, b in
            a.element.key.lexicographicallyPrecedes(b.element.key) || (a.element.key == b.element.key && a.offset < b.offset)
        }
        var issues = ordered.map(\.element.issue)
        if let dropped = firstDropped {
            issues.append(
                ValidationIssue(
                    pointer: dropped.pointer,
                    message: "too many problems: stopped after \(IssueCollector.maxIssues); this one is \(dropped.message)"))
        }
        return ValidationError(issues: issues)
    }
}

/// The field names seen so far in one object, to refuse a repeated one. A node has a handful of fields, where a
/// scan of an array beats hashing into a new set; an object with many is checked with a set, so that stays linear.
private struct FieldNames {
    private static let scanLimit = 16
    private var names: [String] = []
    private var set: Set<String>?

    init(capacity: Int) {
        if capacity > FieldNames.scanLimit {
            set = Set(minimumCapacity: capacity)
        } else {
            names.reserveCapacity(capacity)
        }
    }

    /// Adds `name`; false if it was already there.
    mutating func insert(_ name: String) -> Bool {
        if set != nil { return set?.insert(name).inserted ?? false }
        if names.contains(name) { return false }
        names.append(name)
        return true
    }

    func contains(_ name: String) -> Bool { set?.contains(name) ?? names.contains(name) }
}

/// What a member of an object is, once checked.
private enum NodeType: String {
    case fetch, list, sequence, map
}

/// Walks a job body and builds the `JobSpec`, recording every problem in `issues`.
struct GraphValidator {
    let limits: Limits
    var issues = IssueCollector()

    static let commonFields: Set<String> = ["type", "id", "timeout_ms", "recover"]
    static let fetchFields = Set(FetchField.allCases.map(\.rawValue))
    static let listFields: Set<String> = [
        "children", "fire_on_first_result", "fire_on_first_error", "consume_errors", "cancel_remaining", "concurrency",
    ]
    static let sequenceFields: Set<String> = ["children", "continue_on_error"]
    static let mapFields: Set<String> = [
        "items", "template", "max_items", "tolerated_failures", "fire_on_first_result", "fire_on_first_error",
        "consume_errors", "cancel_remaining", "concurrency",
    ]
    static let topLevelFields = ["graph", "name", "deadline_ms", "metadata"]


    init(limits: Limits) {
        self.limits = limits
    }

    // MARK: - Top level

    mutating func validate(_ body: JSONValue) -> JobSpec? {
        guard case .object(let members) = body else {
            issues.add(Spot(), "must be a JSON object (the job), not \(article(body.typeName))")
            return nil
        }
        var name: String?
        var deadlineMs: Int?
        var metadata: JSONValue?
        var graph: JobGraph?
        var seen = FieldNames(capacity: members.count)
        for (position, member) in members.enumerated() {
            let spot = Spot().member(member.key, at: position)
            guard seen.insert(member.key) else {
                issues.add(spot, "duplicate field")
                continue
            }
            switch member.key {
            case "graph":
                graph = walkGraph(member.value, at: spot)
            case "name":
                guard case .string(let s) = member.value else {
                    issues.add(spot, "must be a string")
                    continue
                }
                if s.unicodeScalars.count > Limits.maxNameScalars {
                    issues.add(spot, "must be at most \(Limits.maxNameScalars) characters")
                }
                name = s
            case "deadline_ms":
                deadlineMs = integer(member.value, in: 1...Limits.maxTimeoutMs, spot)
            case "metadata":
                guard case .object = member.value else {
                    issues.add(spot, "must be an object")
                    continue
                }
                if let size = compactSize(member.value, limit: Limits.maxMetadataBytes),
                    size <= Limits.maxMetadataBytes
                {
                    metadata = member.value
                } else {
                    issues.add(
                        spot,
                        "must be at most \(Limits.maxMetadataBytes) bytes (\(Limits.maxMetadataBytes / 1024) KiB) "
                            + "as compact JSON")
                }
            default:
                issues.add(spot, unknownFieldMessage(member.key, known: GraphValidator.topLevelFields))
            }
        }
        if !seen.contains("graph") {
            issues.add(Spot().missing("graph"), "is required")
        }
        guard let graph, issues.isEmpty else { return nil }
        return JobSpec(name: name, deadlineMs: deadlineMs, metadata: metadata, graph: graph)
    }

    // MARK: - The tree

    /// Where a node's id came from, for the uniqueness check.
    private enum IDSource {
        case defaultPath
        /// Given in the body, at this document position.
        case explicit(Spot)
        /// Given but refused.
        case invalid
    }

    /// The children of a node still to be walked. Children are taken one at a time, so the walk holds one cursor
    /// per level, however wide the tree, and a body refused early never pays for the children after the refusal.
    private struct Cursor {
        var children: [JSONValue]
        var next = 0
        /// The parent's node index, which is also its place.
        var parent: Int
        /// Where `children` is among the parent's members.
        var childrenPosition: Int
        /// The children's depth.
        var depth: Int
        var parentID: String
        /// The one child is a map's `template` (at `/template`, not `/children/<k>`).
        var isTemplate = false
        /// The children are inside a map's template.
        var inTemplate = false
    }

    /// Checks every node in pre-order with an explicit stack, building the pre-order array as it goes.
    private mutating func walkGraph(_ rootValue: JSONValue, at rootSpot: Spot) -> JobGraph? {
        var nodes: [GraphNode] = []
        var stack: [Cursor] = []
        // Effective id (explicit or default) → place of the node that has it (a place is its node's index).
        var idOwners: [String: Int] = [:]
        var reportedTooDeep = false
        var root: JSONValue? = rootValue
        // Explicit ids with where they stand, and the maps' ids: ids a map's copies take are refused (API.md §7.1).
        var explicitIDs: [(id: String, spot: Spot)] = []
        var mapIDs: Set<String> = []

        while true {
            if issues.isFull { return nil }
            let value: JSONValue
            let spot: Spot
            let parent: Int?
            let depth: Int
            let defaultID: String
            var inTemplate = false
            if let rootValue = root {
                root = nil
                (value, spot, parent, depth, defaultID) = (rootValue, rootSpot, nil, 1, "root")
            } else {
                // Read in place: a copy of the cursor retained and released its children and its id for each node.
                let top = stack.count - 1
                guard top >= 0 else { break }
                let position = stack[top].next
                if position == stack[top].children.count {
                    stack.removeLast()
                    continue
                }
                stack[top].next += 1
                value = stack[top].children[position]
                inTemplate = stack[top].inTemplate
                if stack[top].isTemplate {
                    spot = Spot(place: stack[top].parent).member("template", at: stack[top].childrenPosition)
                    // `#` never stands in an explicit id: a template node's default id cannot clash with one, and
                    // marks it as a default when the template is taken out (MapSpec.swift).
                    defaultID = stack[top].parentID + "#t"
                } else {
                    spot = Spot(
                        place: stack[top].parent, member: "children", at: stack[top].childrenPosition, element: position)
                    defaultID = JobGraph.childID(stack[top].parentID, position)
                }
                parent = stack[top].parent
                depth = stack[top].depth
            }
            if depth > limits.maxDepth {
                // Report the first node past the limit only, and never look inside any of them.
                if !reportedTooDeep {
                    reportedTooDeep = true
                    issues.add(
                        spot, "nodes nest deeper than the limit of \(limits.maxDepth) levels (the root is level 1)")
                }
                continue
            }
            if nodes.count >= limits.maxNodes {
                issues.add(spot, "more than the limit of \(limits.maxNodes) nodes in one job")
                return nil
            }
            let index = nodes.count
            if let parent { nodes[parent].children.append(index) }
            var node = GraphNode(
                index: index, id: defaultID, parent: parent, depth: depth, kind: .sequence(SequenceOptions()))
            let place = issues.addPlace(spot)
            let here = Spot(place: place)
            var children: [JSONValue] = []
            var childrenPosition = 0
            var idSource = IDSource.defaultPath
            var childIsTemplate = false
            checkNode(
                value, at: here, into: &node, idSource: &idSource, children: &children,
                childrenPosition: &childrenPosition, childIsTemplate: &childIsTemplate)
            if case .explicit(let idSpot) = idSource {
                explicitIDs.append((node.id, idSpot))
                if inTemplate, node.id.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E }) {
                    issues.add(
                        idSpot,
                        "inside a map template an id made only of digits and dots could be the path id of another "
                            + "node of the same copy; use a name")
                }
            }
            if case .map = node.kind { mapIDs.insert(node.id) }

            if case .invalid = idSource {
                // Its id is already reported; checking the default in its place could only add a false duplicate.
            } else if let ownerPlace = idOwners.updateValue(place, forKey: node.id) {
                // The first node keeps the id; the id is hashed once for the nodes that have their own.
                idOwners[node.id] = ownerPlace
                let owner = issues.pointer(Spot(place: ownerPlace))
                if case .explicit(let idSpot) = idSource {
                    issues.add(idSpot, "duplicate id \"\(node.id)\": already used by the node at \(owner)")
                } else {
                    issues.add(
                        here,
                        "this node's default id \"\(node.id)\" is already used by the node at \(owner); "
                            + "give one of them another id")
                }
            }
            nodes.append(consume node)
            if !children.isEmpty {
                // Room for these children's ids and nodes at once, rather than growing the table and the array by
                // doubling through them (a node is a large value: each doubling copied every node before it).
                let expected = min(limits.maxNodes, nodes.count + children.count)
                if idOwners.capacity < expected { idOwners.reserveCapacity(expected) }
                // At least doubled, so that many small parents still grow it a logarithmic number of times.
                if nodes.capacity < expected { nodes.reserveCapacity(max(expected, 2 * nodes.capacity)) }
                nodes[index].children.reserveCapacity(children.count)
                stack.append(
                    Cursor(
                        children: children, parent: index, childrenPosition: childrenPosition, depth: depth + 1,
                        parentID: defaultID, isTemplate: childIsTemplate, inTemplate: inTemplate || childIsTemplate))
            }
        }
        if !mapIDs.isEmpty {
            for (id, idSpot) in explicitIDs {
                // Ids are at most 64 characters: trying each prefix that ends before a dot stays linear.
                var prefix = ""
                for (k, part) in id.split(separator: ".", omittingEmptySubsequences: false).dropLast().enumerated() {
                    prefix = k == 0 ? String(part) : prefix + "." + part
                    if mapIDs.contains(prefix) {
                        issues.add(
                            idSpot,
                            "ids that begin with \"\(prefix).\" are taken by the copies of the map \"\(prefix)\"")
                        break
                    }
                }
            }
            if !issues.isEmpty { return nil }
        }
        // Places and nodes are numbered together, so with no issue `idOwners` is the graph's id index.
        return JobGraph(nodes: nodes, indexByID: idOwners)
    }

    /// Checks one node's own fields; hands back its children (unchecked) for the walk.
    private mutating func checkNode(
        _ value: JSONValue, at here: Spot, into node: inout GraphNode, idSource: inout IDSource,
        children: inout [JSONValue], childrenPosition: inout Int, childIsTemplate: inout Bool
    ) {
        guard case .object(let members) = value else {
            issues.add(here, "must be an object (a node), not \(article(value.typeName))")
            return
        }

        // The type decides which fields are allowed, so read it first.
        var type: NodeType?
        if let position = members.firstIndex(where: { $0.key == "type" }) {
            let value = members[position].value
            if let s = value.stringValue, let t = NodeType(rawValue: s) {
                type = t
            } else {
                let got = value.stringValue.map { "\"\($0)\"" } ?? article(value.typeName)
                issues.add(here.member("type", at: position), "must be one of fetch, list, sequence, map, not \(got)")
            }
        } else {
            issues.add(here.missing("type"), "is required (fetch, list, sequence or map)")
        }

        var fetch = FetchFields()
        var list = ListOptions()
        var sequence = SequenceOptions()
        // Made only for a map: a `MapSpec` holds a graph, whose copy and release every other node paid for.
        var madeMap: MapSpec?
        var map: MapSpec {
            get { madeMap ?? MapSpec() }
            set { madeMap = newValue }
        }
        var seen = FieldNames(capacity: members.count)
        var sawChildren = false

        for (position, member) in members.enumerated() {
            guard seen.insert(member.key) else {
                issues.add(here.member(member.key, at: position), "duplicate field")
                continue
            }
            // `type` was read before this loop: a spot made for it would go unused.
            if member.key == "type" { continue }
            let spot = here.member(member.key, at: position)
            let value = member.value
            switch member.key {
            case "id":
                if let id = checkID(value, spot) {
                    node.id = id
                    idSource = .explicit(spot)
                } else {
                    idSource = .invalid
                }
                continue
            case "timeout_ms":
                node.timeoutMs = integer(value, in: 1...Limits.maxTimeoutMs, spot)
                continue
            case "recover":
                node.recover = value
                continue
            default:
                break
            }

            guard let type else {
                // Without a valid type only fields no type knows are refused; children are still walked so
                // that their problems are reported too.
                let known =
                    GraphValidator.fetchFields.contains(member.key) || GraphValidator.listFields.contains(member.key)
                    || GraphValidator.sequenceFields.contains(member.key) || GraphValidator.mapFields.contains(member.key)
                if !known {
                    issues.add(spot, unknownFieldMessage(member.key, known: allNodeFields))
                } else if member.key == "children", case .array(let elements) = value {
                    children = elements
                    childrenPosition = position
                }
                continue
            }

            // A fetch's own fields, found by the check's `switch`: hashing the name into `fetchFields` first took 360
            // instructions a field.
            if type == .fetch, checkFetchField(member.key, value, spot, into: &fetch) { continue }
            switch (type, member.key) {
            case (.list, "children"), (.sequence, "children"):
                sawChildren = true
                if case .array(let elements) = value, !elements.isEmpty {
                    children = elements
                    childrenPosition = position
                } else {
                    issues.add(spot, "must be a non-empty array of nodes")
                }
            case (.list, "fire_on_first_result"):
                list.fireOnFirstResult = boolean(value, spot) ?? list.fireOnFirstResult
            case (.list, "fire_on_first_error"):
                list.fireOnFirstError = boolean(value, spot) ?? list.fireOnFirstError
            case (.list, "consume_errors"):
                list.consumeErrors = boolean(value, spot) ?? list.consumeErrors
            case (.list, "cancel_remaining"):
                list.cancelRemaining = boolean(value, spot) ?? list.cancelRemaining
            case (.list, "concurrency"):
                list.concurrency = integer(value, in: 1...Limits.maxConcurrency, spot)
            case (.map, "items"):
                sawChildren = true
                if case .array = value {
                    map.items = .value(value)
                } else {
                    issues.add(spot, "must be an array, or an expression that gives one ({\"$ref\": …})")
                }
            case (.map, "template"):
                if case .object = value {
                    children = [value]
                    childrenPosition = position
                    childIsTemplate = true
                } else {
                    issues.add(spot, "must be an object (a node), not \(article(value.typeName))")
                }
            case (.map, "max_items"):
                map.maxItems = integer(value, in: 0...limits.maxNodes, spot) ?? map.maxItems
            case (.map, "tolerated_failures"):
                map.toleratedFailures = integer(value, in: 0...Limits.maxConcurrency, spot)
            case (.map, "fire_on_first_result"):
                map.options.fireOnFirstResult = boolean(value, spot) ?? map.options.fireOnFirstResult
            case (.map, "fire_on_first_error"):
                map.options.fireOnFirstError = boolean(value, spot) ?? map.options.fireOnFirstError
            case (.map, "consume_errors"):
                map.options.consumeErrors = boolean(value, spot) ?? map.options.consumeErrors
            case (.map, "cancel_remaining"):
                map.options.cancelRemaining = boolean(value, spot) ?? map.options.cancelRemaining
            case (.map, "concurrency"):
                map.options.concurrency = integer(value, in: 1...Limits.maxConcurrency, spot)
            case (.sequence, "continue_on_error"):
                sequence.continueOnError = boolean(value, spot) ?? sequence.continueOnError
            default:
                let allowed = Array(GraphValidator.commonFields) + fieldsOf(type)
                issues.add(spot, unknownFieldMessage(member.key, known: allowed, nodeType: type.rawValue))
            }
        }

        switch type {
        case .fetch:
            if !seen.contains("url") { issues.add(here.missing("url"), "is required") }
            fetch.finish(issues: &issues)
            if let request = fetch.request() { node.kind = .fetch(request) }
        case .list:
            if !sawChildren { issues.add(here.missing("children"), "is required") }
            node.kind = .list(list)
        case .sequence:
            if !sawChildren { issues.add(here.missing("children"), "is required") }
            node.kind = .sequence(sequence)
        case .map:
            if !sawChildren { issues.add(here.missing("items"), "is required") }
            if !childIsTemplate && !seen.contains("template") { issues.add(here.missing("template"), "is required") }
            node.kind = .map(map)
        case nil:
            break
        }
    }

    private var allNodeFields: [String] {
        Array(
            GraphValidator.commonFields.union(GraphValidator.fetchFields).union(GraphValidator.listFields)
                .union(GraphValidator.sequenceFields).union(GraphValidator.mapFields))
    }

    private func fieldsOf(_ type: NodeType) -> [String] {
        switch type {
        case .fetch: return Array(GraphValidator.fetchFields)
        case .list: return Array(GraphValidator.listFields)
        case .sequence: return Array(GraphValidator.sequenceFields)
        case .map: return Array(GraphValidator.mapFields)
        }
    }

    private mutating func checkID(_ value: JSONValue, _ spot: Spot) -> String? {
        let rule = "1 to \(Limits.maxIDLength) characters from A-Z a-z 0-9 _ . -"
        guard case .string(let id) = value else {
            issues.add(spot, "must be a string of \(rule)")
            return nil
        }
        let valid =
            !id.isEmpty && id.utf8.count <= Limits.maxIDLength
            && id.utf8.allSatisfy { c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x5F
                    || c == 0x2E || c == 0x2D
            }
        guard valid else {
            issues.add(spot, "must be \(rule)")
            return nil
        }
        return id
    }

    // MARK: - fetch

    /// The fetch fields seen so far; `nil` where absent or invalid.
    private struct FetchFields {
        var url: String?
        var urlValid = false
        var method: String?
        var headers: [(name: String, value: String)] = []
        var body: FetchRequest.Body?
        var bodyPosition: Spot?
        var expect: FetchExpect = .auto
        var acceptStatus: Set<Int> = []
        var retries = 0
        var retryBackoffMs = 200
        var idempotent: Bool?
        var maxBytes: Int?
        var followRedirects = true
        var coalesce = false
        var coalescePosition: Spot?
        var cache = FetchCacheMode.off
        var cachePosition: Spot?

        mutating func finish(issues: inout IssueCollector) {
            if method == "HEAD", body != nil, let position = bodyPosition {
                issues.add(position, "a HEAD request cannot have a body")
            }
            let method = self.method ?? "GET"
            if coalesce, let position = coalescePosition, method != "GET" && method != "HEAD" || body != nil {
                issues.add(position, "coalesce needs a GET or HEAD request without a body")
            }
            if cache == .use, let position = cachePosition, method != "GET" || body != nil {
                issues.add(position, "cache \"use\" needs a GET request without a body")
            }
        }

        func request() -> FetchRequest? {
            guard let url, urlValid else { return nil }
            return FetchRequest(
                url: url, method: method ?? "GET", headers: headers, body: body, expect: expect,
                acceptStatus: acceptStatus, retries: retries, retryBackoffMs: retryBackoffMs, idempotent: idempotent,
                maxBytes: maxBytes, followRedirects: followRedirects, coalesce: coalesce, cache: cache)
        }
    }

    /// A fetch node's own fields: `fetchFields` names them, and `checkFetchField` checks each.
    enum FetchField: String, CaseIterable {
        case url, method, headers, body, json, expect
        case acceptStatus = "accept_status"
        case retries
        case retryBackoffMs = "retry_backoff_ms"
        case idempotent
        case maxBytes = "max_bytes"
        case followRedirects = "follow_redirects"
        case coalesce, cache

        /// The field named `name`, by a `switch` over the names: `init(rawValue:)` took about 190 instructions more
        /// a field (callgrind, ParseBench's list of fetches). A test checks it against every case's raw value.
        static func named(_ name: String) -> FetchField? {
            switch name {
            case "url": return .url
            case "method": return .method
            case "headers": return .headers
            case "body": return .body
            case "json": return .json
            case "expect": return .expect
            case "accept_status": return .acceptStatus
            case "retries": return .retries
            case "retry_backoff_ms": return .retryBackoffMs
            case "idempotent": return .idempotent
            case "max_bytes": return .maxBytes
            case "follow_redirects": return .followRedirects
            case "coalesce": return .coalesce
            case "cache": return .cache
            default: return nil
            }
        }
    }

    /// Checks `field` of a fetch node; false when it is none of the fetch fields (`FetchField`).
    private mutating func checkFetchField(
        _ field: String, _ value: JSONValue, _ spot: Spot, into fetch: inout FetchFields
    ) -> Bool {
        guard let known = FetchField.named(field) else { return false }
        switch known {
        case .url:
            guard case .string(let url) = value else {
                issues.add(spot, "must be a string (an absolute http or https URL)")
                return true
            }
            fetch.url = url
            if let problem = URLCheck.problem(url, maxBytes: Limits.maxURLBytes) {
                issues.add(spot, problem)
            } else {
                fetch.urlValid = true
            }
        case .method:
            if case .string(let m) = value, FetchRequest.methods.contains(m) {
                fetch.method = m
            } else {
                issues.add(spot, "must be one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS (upper case)")
            }
        case .headers:
            guard case .object(let members) = value else {
                issues.add(spot, "must be an object of header name to string value")
                return true
            }
            for (position, member) in members.enumerated() {
                let header = spot.member(member.key, at: position)
                guard URLCheck.isToken(member.key) else {
                    issues.add(header, "is not a valid HTTP header name")
                    continue
                }
                let lower = member.key.lowercased()
                if lower == "content-length" || lower == "transfer-encoding" {
                    issues.add(header, "is set by the server from the body; leave it out")
                    continue
                }
                guard case .string(let v) = member.value else {
                    issues.add(header, "must be a string")
                    continue
                }
                if v.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }) {
                    issues.add(header, "must not contain CR, LF or NUL")
                    continue
                }
                fetch.headers.append((member.key, v))
            }
        case .body, .json:
            if fetch.bodyPosition != nil {
                issues.add(spot, "give either body or json, not both")
                return true
            }
            fetch.bodyPosition = spot
            if known == .json {
                fetch.body = .json(value)
            } else if case .string(let s) = value {
                fetch.body = .text(s)
            } else {
                issues.add(spot, "must be a string (use json for a JSON body)")
            }
        case .expect:
            if let s = value.stringValue, let e = FetchExpect(rawValue: s) {
                fetch.expect = e
            } else {
                issues.add(spot, "must be one of json, text, bytes, auto")
            }
        case .acceptStatus:
            guard case .array(let elements) = value else {
                issues.add(spot, "must be an array of integers from 100 to 599")
                return true
            }
            for (position, element) in elements.enumerated() {
                if let code = integer(element, in: 100...599, spot.element(position)) {
                    fetch.acceptStatus.insert(code)
                }
            }
        case .retries:
            fetch.retries = integer(value, in: 0...Limits.maxRetries, spot) ?? fetch.retries
        case .retryBackoffMs:
            fetch.retryBackoffMs = integer(value, in: 0...Limits.maxRetryBackoffMs, spot) ?? fetch.retryBackoffMs
        case .idempotent:
            fetch.idempotent = boolean(value, spot)
        case .maxBytes:
            fetch.maxBytes = integer(value, in: 0...max(0, limits.maxResponseBytes), spot)
        case .followRedirects:
            fetch.followRedirects = boolean(value, spot) ?? fetch.followRedirects
        case .coalesce:
            fetch.coalesce = boolean(value, spot) ?? false
            fetch.coalescePosition = spot
        case .cache:
            if let s = value.stringValue, let mode = FetchCacheMode(rawValue: s) {
                fetch.cache = mode
                fetch.cachePosition = spot
            } else {
                issues.add(spot, "must be \"use\" or \"off\"")
            }
        }
        return true
    }

    // MARK: - Scalars

    /// An integer in `range`; `1.0` and `1e2` count, `1.5`, `"1"` and `true` do not.
    private mutating func integer(_ value: JSONValue, in range: ClosedRange<Int>, _ spot: Spot) -> Int? {
        let message = "must be an integer from \(range.lowerBound) to \(range.upperBound)"
        guard case .number = value else {
            issues.add(spot, "\(message), not \(article(value.typeName))")
            return nil
        }
        guard let n = value.intValue, range.contains(n) else {
            issues.add(spot, message)
            return nil
        }
        return n
    }

    private mutating func boolean(_ value: JSONValue, _ spot: Spot) -> Bool? {
        guard case .bool(let b) = value else {
            issues.add(spot, "must be a boolean, not \(article(value.typeName))")
            return nil
        }
        return b
    }

    private func unknownFieldMessage(_ field: String, known: [String], nodeType: String? = nil) -> String {
        var message = nodeType.map { "unknown field for a \($0) node" } ?? "unknown field"
        if let suggestion = closest(to: field, in: known) { message += " (did you mean \(suggestion)?)" }
        return message
    }
}

/// `an object`, `a string`…
private func article(_ typeName: String) -> String {
    typeName.first.map { "aeiou".contains($0) } == true ? "an \(typeName)" : "a \(typeName)"
}

/// The known name within edit distance 2 of `word`, for "did you mean" hints.
private func closest(to word: String, in candidates: [String]) -> String? {
    let w = Array(word.utf8)
    guard w.count <= 64 else { return nil }
    var best: (name: String, distance: Int)?
    for candidate in candidates.sorted() {
        let c = Array(candidate.utf8)
        guard abs(c.count - w.count) <= 2 else { continue }
        var previous = Array(0...c.count)
        for i in 1...max(1, w.count) where !w.isEmpty {
            var current = [i] + Array(repeating: 0, count: c.count)
            for j in 1...max(1, c.count) where !c.isEmpty {
                current[j] = Swift.min(
                    previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (w[i - 1] == c[j - 1] ? 0 : 1))
            }
            previous = current
        }
        let d = previous[c.count]
        if d <= 2, d < (best?.distance ?? Int.max) { best = (candidate, d) }
    }
    return best?.name
}

/// The length of `value`'s compact JSON text, as `JSONValue.write` produces it, counted without recursion;
/// `nil` as soon as it exceeds `limit`.
func compactSize(_ value: JSONValue, limit: Int) -> Int? {
    var size = 0
    var pending: [JSONValue] = [value]
    while let next = pending.popLast() {
        switch next {
        case .null: size += 4
        case .bool(let b): size += b ? 4 : 5
        case .number(let n): size += n.utf8.count
        case .string(let s): size += escapedSize(s)
        case .array(let elements):
            size += 2 + max(0, elements.count - 1)
            pending.append(contentsOf: elements)
        case .object(let members):
            size += 2 + max(0, members.count - 1)
            for member in members {
                size += escapedSize(member.key) + 1
                pending.append(member.value)
            }
        }
        if size > limit { return nil }
    }
    return size
}

private func escapedSize(_ s: String) -> Int {
    var size = 2
    for c in s.utf8 {
        switch c {
        case 0x22, 0x5C, 0x0A, 0x0D, 0x09: size += 2
        case 0..<0x20: size += 6
        default: size += 1
        }
    }
    return size
}
