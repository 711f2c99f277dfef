/// Collects issues, each with a key giving its position in the document so that
/// the final list is in document order even though nodes are checked before
/// fields that follow their `children`.
struct IssueCollector {
    static let maxIssues = 100

    private var collected: [(key: [Int], issue: ValidationIssue)] = []
    private var firstDropped: ValidationIssue?

    /// True once more issues were found than are reported; walking can stop.
    var isFull: Bool { firstDropped != nil }
    var isEmpty: Bool { collected.isEmpty }

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

/// What a member of an object is, once checked.
private enum NodeType: String {
    case fetch, list, sequence
}

/// Walks a job body and builds the `JobSpec`, recording every problem in `issues`.
struct GraphValidator {
    let limits: Limits
    var issues = IssueCollector()

    static let commonFields: Set<String> = ["type", "id", "timeout_ms", "recover"]
    static let fetchFields: Set<String> = [
        "url", "method", "headers", "body", "json", "expect", "accept_status", "retries", "retry_backoff_ms",
        "idempotent", "max_bytes", "follow_redirects",
    ]
    static let listFields: Set<String> = [
        "children", "fire_on_first_result", "fire_on_first_error", "consume_errors", "cancel_remaining", "concurrency",
    ]
    static let sequenceFields: Set<String> = ["children", "continue_on_error"]
    static let topLevelFields = ["graph", "name", "deadline_ms", "metadata"]


    init(limits: Limits) {
        self.limits = limits
    }

    // MARK: - Top level

    mutating func validate(_ body: JSONValue) -> JobSpec? {
        guard case .object(let members) = body else {
            issues.add("", "must be a JSON object (the job), not \(article(body.typeName))", key: [])
            return nil
        }
        var name: String?
        var deadlineMs: Int?
        var metadata: JSONValue?
        var graph: JobGraph?
        var seen = Set<String>()
        for (position, member) in members.enumerated() {
            let pointer = "/" + JSONPointer.escape(member.key)
            let key = [position]
            guard seen.insert(member.key).inserted else {
                issues.add(pointer, "duplicate field", key: key)
                continue
            }
            switch member.key {
            case "graph":
                graph = walkGraph(member.value, pointer: pointer, key: key)
            case "name":
                guard case .string(let s) = member.value else {
                    issues.add(pointer, "must be a string", key: key)
                    continue
                }
                if s.unicodeScalars.count > Limits.maxNameScalars {
                    issues.add(pointer, "must be at most \(Limits.maxNameScalars) characters", key: key)
                }
                name = s
            case "deadline_ms":
                deadlineMs = integer(member.value, in: 1...Limits.maxTimeoutMs, pointer, key)
            case "metadata":
                guard case .object = member.value else {
                    issues.add(pointer, "must be an object", key: key)
                    continue
                }
                if let size = compactSize(member.value, limit: Limits.maxMetadataBytes),
                    size <= Limits.maxMetadataBytes
                {
                    metadata = member.value
                } else {
                    issues.add(
                        pointer, "must be at most \(Limits.maxMetadataBytes) bytes (\(Limits.maxMetadataBytes / 1024) KiB) as compact JSON",
                        key: key)
                }
            default:
                issues.add(pointer, unknownFieldMessage(member.key, known: GraphValidator.topLevelFields), key: key)
            }
        }
        if !seen.contains("graph") {
            issues.add("/graph", "is required", key: [])
        }
        guard let graph, issues.isEmpty else { return nil }
        return JobSpec(name: name, deadlineMs: deadlineMs, metadata: metadata, graph: graph)
    }

    // MARK: - The tree

    /// Where a node's id came from, for the uniqueness check.
    private enum IDSource {
        case defaultPath
        /// Given in the body, at this document position.
        case explicit(key: [Int])
        /// Given but refused.
        case invalid
    }

    private struct Frame {
        var value: JSONValue
        var pointer: String
        var key: [Int]
        var parent: Int?
        var depth: Int
        var defaultID: String
    }

    /// Checks every node with an explicit stack, building the pre-order array as it goes.
    private mutating func walkGraph(_ rootValue: JSONValue, pointer: String, key: [Int]) -> JobGraph? {
        var nodes: [GraphNode] = []
        var stack = [Frame(value: rootValue, pointer: pointer, key: key, parent: nil, depth: 1, defaultID: "root")]
        // Effective id (explicit or default) → pointer of the node that has it.
        var idOwners: [String: String] = [:]
        var reportedTooDeep = false

        while let frame = stack.popLast() {
            if issues.isFull { return nil }
            if frame.depth > limits.maxDepth {
                // Report the first node past the limit only, and never look inside any of them.
                if !reportedTooDeep {
                    reportedTooDeep = true
                    issues.add(
                        frame.pointer,
                        "nodes nest deeper than the limit of \(limits.maxDepth) levels (the root is level 1)",
                        key: frame.key)
                }
                continue
            }
            if nodes.count >= limits.maxNodes {
                issues.add(frame.pointer, "more than the limit of \(limits.maxNodes) nodes in one job", key: frame.key)
                return nil
            }
            let index = nodes.count
            if let parent = frame.parent { nodes[parent].children.append(index) }
            var node = GraphNode(
                index: index, id: frame.defaultID, parent: frame.parent, depth: frame.depth,
                kind: .sequence(SequenceOptions()))
            var children: [JSONValue] = []
            var childrenKey: [Int] = []
            var idSource = IDSource.defaultPath
            checkNode(frame, into: &node, idSource: &idSource, children: &children, childrenKey: &childrenKey)

            if case .invalid = idSource {
                // Its id is already reported; checking the default in its place could only add a false duplicate.
            } else if let owner = idOwners[node.id] {
                if case .explicit(let idKey) = idSource {
                    issues.add(
                        frame.pointer + "/id", "duplicate id \"\(node.id)\": already used by the node at \(owner)",
                        key: idKey)
                } else {
                    issues.add(
                        frame.pointer,
                        "this node's default id \"\(node.id)\" is already used by the node at \(owner); "
                            + "give one of them another id",
                        key: frame.key)
                }
            } else {
                idOwners[node.id] = frame.pointer
            }
            nodes.append(node)

            // Each child is at least one node, so the node past `maxNodes` is among the first `budget + 1`
            // children; pushing no more keeps a body of a million tiny children cheap to refuse.
            let budget = max(0, limits.maxNodes - nodes.count)
            let pushed = children.indices.prefix(budget + 1)
            // Reverse, so that children come off the stack in order.
            for position in pushed.reversed() {
                stack.append(
                    Frame(
                        value: children[position], pointer: frame.pointer + "/children/\(position)",
                        key: childrenKey + [position], parent: index, depth: frame.depth + 1,
                        defaultID: frame.defaultID + ".\(position)"))
            }
        }
        return JobGraph(nodes: nodes)
    }

    /// Checks one node's own fields; hands back its children (unchecked) for the walk.
    private mutating func checkNode(
        _ frame: Frame, into node: inout GraphNode, idSource: inout IDSource, children: inout [JSONValue],
        childrenKey: inout [Int]
    ) {
        let base = frame.pointer
        guard case .object(let members) = frame.value else {
            issues.add(base, "must be an object (a node), not \(article(frame.value.typeName))", key: frame.key)
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
                issues.add(base + "/type", "must be one of fetch, list, sequence, not \(got)", key: frame.key + [position])
            }
        } else {
            issues.add(base + "/type", "is required (fetch, list or sequence)", key: frame.key)
        }

        var fetch = FetchFields()
        var list = ListOptions()
        var sequence = SequenceOptions()
        var seen = Set<String>()
        var sawChildren = false

        for (position, member) in members.enumerated() {
            let pointer = base + "/" + JSONPointer.escape(member.key)
            let key = frame.key + [position]
            guard seen.insert(member.key).inserted else {
                issues.add(pointer, "duplicate field", key: key)
                continue
            }
            let value = member.value
            switch member.key {
            case "type":
                continue
            case "id":
                if let id = checkID(value, pointer, key) {
                    node.id = id
                    idSource = .explicit(key: key)
                } else {
                    idSource = .invalid
                }
                continue
            case "timeout_ms":
                node.timeoutMs = integer(value, in: 1...Limits.maxTimeoutMs, pointer, key)
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
                    || GraphValidator.sequenceFields.contains(member.key)
                if !known {
                    issues.add(pointer, unknownFieldMessage(member.key, known: allNodeFields), key: key)
                } else if member.key == "children", case .array(let elements) = value {
                    children = elements
                    childrenKey = key
                }
                continue
            }

            switch (type, member.key) {
            case (.list, "children"), (.sequence, "children"):
                sawChildren = true
                if case .array(let elements) = value, !elements.isEmpty {
                    children = elements
                    childrenKey = key
                } else {
                    issues.add(pointer, "must be a non-empty array of nodes", key: key)
                }
            case (.list, "fire_on_first_result"):
                list.fireOnFirstResult = boolean(value, pointer, key) ?? list.fireOnFirstResult
            case (.list, "fire_on_first_error"):
                list.fireOnFirstError = boolean(value, pointer, key) ?? list.fireOnFirstError
            case (.list, "consume_errors"):
                list.consumeErrors = boolean(value, pointer, key) ?? list.consumeErrors
            case (.list, "cancel_remaining"):
                list.cancelRemaining = boolean(value, pointer, key) ?? list.cancelRemaining
            case (.list, "concurrency"):
                list.concurrency = integer(value, in: 1...Limits.maxConcurrency, pointer, key)
            case (.sequence, "continue_on_error"):
                sequence.continueOnError = boolean(value, pointer, key) ?? sequence.continueOnError
            case (.fetch, _) where GraphValidator.fetchFields.contains(member.key):
                checkFetchField(member.key, value, pointer, key, into: &fetch)
            default:
                let allowed = Array(GraphValidator.commonFields) + fieldsOf(type)
                issues.add(
                    pointer, unknownFieldMessage(member.key, known: allowed, nodeType: type.rawValue), key: key)
            }
        }

        switch type {
        case .fetch:
            if !seen.contains("url") { issues.add(base + "/url", "is required", key: frame.key) }
            fetch.finish(base: base, issues: &issues)
            if let request = fetch.request() { node.kind = .fetch(request) }
        case .list:
            if !sawChildren { issues.add(base + "/children", "is required", key: frame.key) }
            node.kind = .list(list)
        case .sequence:
            if !sawChildren { issues.add(base + "/children", "is required", key: frame.key) }
            node.kind = .sequence(sequence)
        case nil:
            break
        }
    }

    private var allNodeFields: [String] {
        Array(GraphValidator.commonFields.union(GraphValidator.fetchFields).union(GraphValidator.listFields))
            + Array(GraphValidator.sequenceFields)
    }

    private func fieldsOf(_ type: NodeType) -> [String] {
        switch type {
        case .fetch: return Array(GraphValidator.fetchFields)
        case .list: return Array(GraphValidator.listFields)
        case .sequence: return Array(GraphValidator.sequenceFields)
        }
    }

    private mutating func checkID(_ value: JSONValue, _ pointer: String, _ key: [Int]) -> String? {
        let rule = "1 to \(Limits.maxIDLength) characters from A-Z a-z 0-9 _ . -"
        guard case .string(let id) = value else {
            issues.add(pointer, "must be a string of \(rule)", key: key)
            return nil
        }
        let valid =
            !id.isEmpty && id.utf8.count <= Limits.maxIDLength
            && id.utf8.allSatisfy { c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x5F
                    || c == 0x2E || c == 0x2D
            }
        guard valid else {
            issues.add(pointer, "must be \(rule)", key: key)
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
        var bodyPosition: (pointer: String, key: [Int])?
        var expect: FetchExpect = .auto
        var acceptStatus: Set<Int> = []
        var retries = 0
        var retryBackoffMs = 200
        var idempotent: Bool?
        var maxBytes: Int?
        var followRedirects = true

        mutating func finish(base: String, issues: inout IssueCollector) {
            if method == "HEAD", body != nil, let position = bodyPosition {
                issues.add(position.pointer, "a HEAD request cannot have a body", key: position.key)
            }
        }

        func request() -> FetchRequest? {
            guard let url, urlValid else { return nil }
            return FetchRequest(
                url: url, method: method ?? "GET", headers: headers, body: body, expect: expect,
                acceptStatus: acceptStatus, retries: retries, retryBackoffMs: retryBackoffMs, idempotent: idempotent,
                maxBytes: maxBytes, followRedirects: followRedirects)
        }
    }

    private mutating func checkFetchField(
        _ field: String, _ value: JSONValue, _ pointer: String, _ key: [Int], into fetch: inout FetchFields
    ) {
        switch field {
        case "url":
            guard case .string(let url) = value else {
                issues.add(pointer, "must be a string (an absolute http or https URL)", key: key)
                return
            }
            fetch.url = url
            if let problem = URLCheck.problem(url, maxBytes: Limits.maxURLBytes) {
                issues.add(pointer, problem, key: key)
            } else {
                fetch.urlValid = true
            }
        case "method":
            if case .string(let m) = value, FetchRequest.methods.contains(m) {
                fetch.method = m
            } else {
                issues.add(pointer, "must be one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS (upper case)", key: key)
            }
        case "headers":
            guard case .object(let members) = value else {
                issues.add(pointer, "must be an object of header name to string value", key: key)
                return
            }
            for (position, member) in members.enumerated() {
                let headerPointer = pointer + "/" + JSONPointer.escape(member.key)
                let headerKey = key + [position]
                guard URLCheck.isToken(member.key) else {
                    issues.add(headerPointer, "is not a valid HTTP header name", key: headerKey)
                    continue
                }
                let lower = member.key.lowercased()
                if lower == "content-length" || lower == "transfer-encoding" {
                    issues.add(headerPointer, "is set by the server from the body; leave it out", key: headerKey)
                    continue
                }
                guard case .string(let v) = member.value else {
                    issues.add(headerPointer, "must be a string", key: headerKey)
                    continue
                }
                if v.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }) {
                    issues.add(headerPointer, "must not contain CR, LF or NUL", key: headerKey)
                    continue
                }
                fetch.headers.append((member.key, v))
            }
        case "body", "json":
            if fetch.bodyPosition != nil {
                issues.add(pointer, "give either body or json, not both", key: key)
                return
            }
            fetch.bodyPosition = (pointer, key)
            if field == "json" {
                fetch.body = .json(value)
            } else if case .string(let s) = value {
                fetch.body = .text(s)
            } else {
                issues.add(pointer, "must be a string (use json for a JSON body)", key: key)
            }
        case "expect":
            if let s = value.stringValue, let e = FetchExpect(rawValue: s) {
                fetch.expect = e
            } else {
                issues.add(pointer, "must be one of json, text, bytes, auto", key: key)
            }
        case "accept_status":
            guard case .array(let elements) = value else {
                issues.add(pointer, "must be an array of integers from 100 to 599", key: key)
                return
            }
            for (position, element) in elements.enumerated() {
                if let code = integer(element, in: 100...599, pointer + "/\(position)", key + [position]) {
                    fetch.acceptStatus.insert(code)
                }
            }
        case "retries":
            fetch.retries = integer(value, in: 0...Limits.maxRetries, pointer, key) ?? fetch.retries
        case "retry_backoff_ms":
            fetch.retryBackoffMs = integer(value, in: 0...Limits.maxRetryBackoffMs, pointer, key) ?? fetch.retryBackoffMs
        case "idempotent":
            fetch.idempotent = boolean(value, pointer, key)
        case "max_bytes":
            fetch.maxBytes = integer(value, in: 0...max(0, limits.maxResponseBytes), pointer, key)
        case "follow_redirects":
            fetch.followRedirects = boolean(value, pointer, key) ?? fetch.followRedirects
        default:
            break
        }
    }

    // MARK: - Scalars

    /// An integer in `range`; `1.0` and `1e2` count, `1.5`, `"1"` and `true` do not.
    private mutating func integer(_ value: JSONValue, in range: ClosedRange<Int>, _ pointer: String, _ key: [Int])
        -> Int?
    {
        let message = "must be an integer from \(range.lowerBound) to \(range.upperBound)"
        guard case .number = value else {
            issues.add(pointer, "\(message), not \(article(value.typeName))", key: key)
            return nil
        }
        guard let n = value.intValue, range.contains(n) else {
            issues.add(pointer, message, key: key)
            return nil
        }
        return n
    }

    private mutating func boolean(_ value: JSONValue, _ pointer: String, _ key: [Int]) -> Bool? {
        guard case .bool(let b) = value else {
            issues.add(pointer, "must be a boolean, not \(article(value.typeName))", key: key)
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
