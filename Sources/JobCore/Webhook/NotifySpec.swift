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
        return outcome
    }
}
