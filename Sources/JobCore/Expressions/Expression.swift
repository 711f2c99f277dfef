// The expression model of API.md §6: `$ref`, `$concat` and `$literal`, as they
// stand in a fetch's url, headers, query, body and json, and in a node's
// recover. Everything here is checked at submit (`DataflowParser`); only
// `$ref`s are left to evaluate when a node starts (`ExpressionResolver`).
// Parts without any `$ref` are folded into plain values at submit, so a
// template exists only where something is read from the scope.

/// An RFC 6901 JSON Pointer, split into its reference tokens.
public struct JSONPointerPath: Equatable, Sendable, CustomStringConvertible {
    /// The pointer as written (`/nodes/login/result/token`).
    public var text: String
    /// Its tokens, unescaped (`~1` → `/`, `~0` → `~`).
    public var tokens: [String]

    /// Parses `text`; `nil` unless it is `""` or a `/`-separated list of tokens where every `~` is followed by
    /// `0` or `1`.
    public init?(_ text: String) {
        self.text = text
        guard !text.isEmpty else {
            self.tokens = []
            return
        }
        guard text.utf8.first == UInt8(ascii: "/") else { return nil }
        var tokens: [String] = []
        for raw in text.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).dropFirst() {
            var bytes: [UInt8] = []
            bytes.reserveCapacity(raw.count)
            var tilde = false
            for c in raw {
                if tilde {
                    switch c {
                    case UInt8(ascii: "0"): bytes.append(UInt8(ascii: "~"))
                    case UInt8(ascii: "1"): bytes.append(UInt8(ascii: "/"))
                    default: return nil
                    }
                    tilde = false
                } else if c == UInt8(ascii: "~") {
                    tilde = true
                } else {
                    bytes.append(c)
                }
            }
            if tilde { return nil }
            tokens.append(String(decoding: bytes, as: UTF8.self))
        }
        self.tokens = tokens
    }

    public var description: String { text }

    /// The pointer made of the first `count` tokens, for messages.
    public func prefix(_ count: Int) -> String { JSONPointer.make(tokens.prefix(count)) }
}

/// Why a pointer found nothing: the first token that was missing and what stood in its way.
public struct PointerMiss: Error, Equatable, Sendable {
    /// Index of the first token that found nothing.
    public var tokenIndex: Int
    /// The reason, e.g. `/nodes/login/result has no member "token"`.
    public var reason: String
}

extension JSONValue {
    /// The value at `tokens` below this value, or where it stopped.
    ///
    /// Walks the value in place: each step hands on the member or element found, which shares its storage with
    /// this value, so reading from a large result copies nothing of it.
    /// - Parameters:
    ///   - tokens: the pointer's tokens from `start`.
    ///   - start: how many tokens of the full pointer were used to reach this value (for `PointerMiss`).
    ///   - fullTokens: the whole pointer's tokens, to name the place in a miss.
    func value(at tokens: ArraySlice<String>, fullTokens: [String]) -> Result<JSONValue, PointerMiss> {
        var current = self
        for k in tokens.indices {
            let token = tokens[k]
            let here = JSONPointer.make(fullTokens.prefix(k))
            switch current {
            case .object(let members):
                guard let member = members.last(where: { $0.key == token }) else {
                    return .failure(PointerMiss(tokenIndex: k, reason: "\(here) has no member \"\(token)\""))
                }
                current = member.value
            case .array(let elements):
                guard let position = JSONPointerPath.arrayIndex(token) else {
                    return .failure(
                        PointerMiss(tokenIndex: k, reason: "\(here) is an array and \"\(token)\" is not an index"))
                }
                guard position < elements.count else {
                    return .failure(
                        PointerMiss(
                            tokenIndex: k,
                            reason: "\(here) is an array of \(elements.count), with no index \(position)"))
                }
                current = elements[position]
            default:
                return .failure(
                    PointerMiss(tokenIndex: k, reason: "\(here) is \(current.typeName == "null" ? "null" : "a \(current.typeName)"), which has no \"\(token)\""))
            }
        }
        return .success(current)
    }
}

extension JSONPointerPath {
    /// RFC 6901 array index: `0`, or digits without a leading zero; `-` (past the end) is never there.
    static func arrayIndex(_ token: String) -> Int? {
        let bytes = token.utf8
        guard let first = bytes.first, bytes.count <= 18, bytes.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else {
            return nil
        }
        if first == 0x30 && bytes.count > 1 { return nil }
        return Int(token)
    }
}

/// A `$ref`: a pointer into the scope of API.md §6.1, with its optional `default`.
public struct ScopeRef: Equatable, Sendable {
    public var pointer: JSONPointerPath
    /// Used when nothing is at the pointer; `nil` when no `default` was given (`.some(.null)` is a null default).
    public var defaultValue: JSONValue?

    public init(pointer: JSONPointerPath, defaultValue: JSONValue? = nil) {
        self.pointer = pointer
        self.defaultValue = defaultValue
    }

    /// The node id read, for `/nodes/<id>…`.
    public var nodeID: String? {
        guard pointer.tokens.count >= 2, pointer.tokens[0] == "nodes" else { return nil }
        return pointer.tokens[1]
    }
}

/// One piece of a string built at run time.
public enum StringPart: Equatable, Sendable {
    /// Written in the graph; used as is.
    case text(String)
    /// Read from the scope; must be a string, number or boolean.
    case ref(ScopeRef)
}

/// A string with at least one `$ref` in it: a url, a header or query value, a body, or a `$concat`.
public struct StringTemplate: Equatable, Sendable {
    public var parts: [StringPart]

    public init(_ parts: [StringPart]) { self.parts = parts }

    /// The string when no part is a reference.
    public var constant: String? {
        var out = ""
        for part in parts {
            guard case .text(let s) = part else { return nil }
            out += s
        }
        return out
    }
}

/// A JSON value with `$ref`s inside (in `json` and `recover`). Members and elements without any keep their
/// submitted value untouched.
public indirect enum ValueTemplate: Equatable, Sendable {
    /// Taken as is.
    case value(JSONValue)
    /// A whole-value `$ref`: the value found, of any type, as it is.
    case ref(ScopeRef)
    /// A `$concat`: always a string.
    case concat(StringTemplate)
    case array([ValueTemplate])
    case object([TemplateMember])

    /// The value when nothing is read from the scope.
    public var constant: JSONValue? {
        if case .value(let v) = self { return v }
        return nil
    }
}

/// One member of an object template.
public struct TemplateMember: Equatable, Sendable {
    public var key: String
    public var value: ValueTemplate

    public init(_ key: String, _ value: ValueTemplate) {
        self.key = key
        self.value = value
    }
}

/// A header or a `query` parameter, in the order given, whose value may be built at run time.
public struct NamedTemplate: Equatable, Sendable {
    public var name: String
    public var value: StringTemplate

    public init(name: String, value: StringTemplate) {
        self.name = name
        self.value = value
    }
}

/// What a node reads and selects (API.md §6): every field is `nil` when the node has nothing of that kind, and
/// then the node's `FetchRequest` and `recover` are used as validated.
public struct NodeDataflow: Equatable, Sendable {
    /// The url, when a `$ref` builds part of it.
    public var url: StringTemplate?
    /// Every header in order, when a `$ref` builds any of their values.
    public var headers: [NamedTemplate]?
    /// The `query` parameters, appended to the url in this order.
    public var query: [NamedTemplate] = []
    /// A `body` built with a `$ref`.
    public var body: StringTemplate?
    /// A `json` body with a `$ref` inside.
    public var json: ValueTemplate?
    /// A `recover` value with a `$ref` inside.
    public var recover: ValueTemplate?
    /// Applied to the node's result when it succeeds.
    public var select: JSONPointerPath?
    /// A fetch's `paginate` (API.md §7.2).
    public var paginate: PaginateSpec?
    /// A map's `items` with a `$ref` in it (API.md §7.1).
    public var items: ValueTemplate?

    public init() {}

    /// True when the node's request is built at run time, so it is resolved before the fetch starts.
    public var buildsRequest: Bool { url != nil || headers != nil || !query.isEmpty || body != nil || json != nil }

    /// True when the request body is built at run time, so the resolved body is kept with the node.
    public var buildsBody: Bool { body != nil || json != nil }

    /// True when the node has none of these: `NodeDataflow()`. Asked for every node a submission walks, where
    /// comparing with `NodeDataflow()` compared each field through its optional (440 instructions a node), and
    /// `== nil` copied each one out (230): a pattern reads the tag only.
    var isEmpty: Bool {
        guard query.isEmpty, case .none = url, case .none = headers, case .none = body, case .none = json,
            case .none = recover, case .none = select, case .none = paginate, case .none = items
        else { return false }
        return true
    }
}
