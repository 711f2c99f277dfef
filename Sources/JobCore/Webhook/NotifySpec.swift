/// Where a job's completion webhook goes (API.md §8 `notify`).
public struct NotifyTarget: Equatable, Sendable {
    public var url: String

    public init(url: String) { self.url = url }
}

/// A job's webhook delivery as the job object shows it (`notify`).
public struct NotifyStatus: Equatable, Sendable {
    /// `pending` (also before the job settles), `delivered` or `failed`.
    public var state: String
    public var attempts: Int
    public var lastStatus: Int?

    public init(state: String, attempts: Int = 0, lastStatus: Int? = nil) {
        self.state = state
        self.attempts = attempts
        self.lastStatus = lastStatus
    }

    /// A delivery not made yet.
    public static let pending = NotifyStatus(state: "pending")
}

extension JobRecord {
    /// The `notify` URL of the submitted request, when the record carries its request.
    public var notifyURL: String? {
        request["notify"]?["url"]?.stringValue
    }
}

/// Reads `notify` off a submitted body before the graph validator sees it (which knows only the fields of API.md §1).
enum NotifyParser {
    /// The deepest a request with `notify` may nest: the store's trigger reads `notify.url` with SQLite's JSON
    /// functions, which refuse documents nested deeper than about 1,000 levels (StoreSchema, migration 3).
    static let maxRequestDepth = 900

    struct Outcome {
        /// The body without `notify`.
        var body: JSONValue
        var target: NotifyTarget?
        var issues: [(pointer: String, message: String, key: [Int])] = []
    }

    static func extract(_ body: JSONValue) -> Outcome {
        guard case .object(let members) = body, members.contains(where: { $0.key == "notify" }) else {
            return Outcome(body: body, target: nil)
        }
        var outcome = Outcome(body: .object(members.filter { $0.key != "notify" }), target: nil)
        var seen = false
        for (position, member) in members.enumerated() where member.key == "notify" {
            if seen {
                outcome.issues.append(("/notify", "duplicate field", [position]))
                continue
            }
            seen = true
            guard case .object(let fields) = member.value else {
                outcome.issues.append(("/notify", "must be an object with a url", [position]))
                continue
            }
            var url: String?
            for (index, field) in fields.enumerated() {
                let pointer = "/notify/" + JSONPointer.escape(field.key)
                switch field.key {
                case "url":
                    guard case .string(let s) = field.value else {
                        outcome.issues.append((pointer, "must be a string", [position, index]))
                        continue
                    }
                    if let problem = URLCheck.problem(s, maxBytes: Limits.maxURLBytes) {
                        outcome.issues.append((pointer, problem, [position, index]))
                    } else {
                        url = s
                    }
                default:
                    outcome.issues.append((pointer, "unknown field (notify has url)", [position, index]))
                }
            }
            if !fields.contains(where: { $0.key == "url" }) {
                outcome.issues.append(("/notify/url", "is required", [position]))
            }
            if let url { outcome.target = NotifyTarget(url: url) }
        }
        if outcome.target != nil, depth(of: body, exceeds: maxRequestDepth) {
            outcome.issues.append(
                ("/notify", "a job with notify may nest at most \(maxRequestDepth) levels of JSON", [0]))
            outcome.target = nil
        }
        return outcome
    }

    /// Whether `value` nests deeper than `limit` levels; walks with a stack of its own, not recursion.
    static func depth(of value: JSONValue, exceeds limit: Int) -> Bool {
        var stack: [(JSONValue, Int)] = [(value, 1)]
        while let (current, level) = stack.popLast() {
            switch current {
            case .object(let members):
                if level > limit { return true }
                for member in members { stack.append((member.value, level + 1)) }
            case .array(let elements):
                if level > limit { return true }
                for element in elements { stack.append((element, level + 1)) }
            default:
                break
            }
        }
        return false
    }
}
