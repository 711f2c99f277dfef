import JobCore

/// A query parameter that is out of range or malformed: `400 bad_request` (API.md §5), never clamped.
struct QueryError: Error, Equatable {
    var message: String
}

/// The query parameters of the routes that take any; unknown parameters are ignored.
enum QueryParameters {
    /// `GET /v1/jobs/{id}`: `wait` (0–60 s) and `since` (a version).
    struct JobWait: Equatable {
        var waitSeconds: Int?
        var sinceVersion: Int64?
    }

    /// `GET /v1/jobs`: `state`, `limit` (1–500, default 50) and `cursor`.
    struct JobList: Equatable {
        var state: NodeState?
        var limit = 50
        var cursor: String?
    }

    typealias Items = [(name: String, value: String)]

    static func jobWait(_ items: Items) throws -> JobWait {
        var out = JobWait()
        if let text = try single("wait", items) {
            guard let value = decimal(text), value <= 60 else {
                throw QueryError(message: "wait must be an integer number of seconds from 0 to 60, not \"\(text)\"")
            }
            out.waitSeconds = Int(value)
        }
        if let text = try single("since", items) {
            guard let value = decimal(text) else {
                throw QueryError(message: "since must be a job version (a non-negative integer), not \"\(text)\"")
            }
            out.sinceVersion = value
        }
        return out
    }

    static func jobList(_ items: Items) throws -> JobList {
        var out = JobList()
        if let text = try single("state", items) {
            guard let state = NodeState(rawValue: text) else {
                let known = NodeState.allCases.map(\.rawValue).joined(separator: ", ")
                throw QueryError(message: "state must be one of \(known), not \"\(text)\"")
            }
            out.state = state
        }
        if let text = try single("limit", items) {
            guard let value = decimal(text), (1...500).contains(value) else {
                throw QueryError(message: "limit must be an integer from 1 to 500, not \"\(text)\"")
            }
            out.limit = Int(value)
        }
        if let text = try single("cursor", items) {
            guard (1...200).contains(text.utf8.count) else {
                throw QueryError(message: "cursor is not one this server gave out")
            }
            out.cursor = text
        }
        return out
    }

    /// `GET /v1/jobs/{id}/nodes`: `include=result` or nothing.
    static func includeResult(_ items: Items) throws -> Bool {
        guard let text = try single("include", items) else { return false }
        guard text == "result" else { throw QueryError(message: "include must be \"result\", not \"\(text)\"") }
        return true
    }

    /// The value of a parameter given at most once.
    private static func single(_ name: String, _ items: Items) throws -> String? {
        let values = items.filter { $0.name == name }
        guard values.count <= 1 else { throw QueryError(message: "\(name) is given more than once") }
        return values.first?.value
    }

    /// Plain ASCII digits only (no sign, no spaces, no exponent), as an Int64.
    private static func decimal(_ text: String) -> Int64? {
        guard !text.isEmpty, text.utf8.count <= 19, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int64(text)
    }
}
