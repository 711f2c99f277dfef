// The request a fetch sent, as kept with its node (API.md §6.3): shown on node
// reads with credentials masked, and sent again unchanged when the fetch runs
// again after a restart.
//
// Stored form: {"method", "url", "headers": {name: value, …}, "body"?}. The
// headers are the node's (resolved) ones plus the Content-Type the fetcher
// adds to a JSON body. `body` ({"text": s} or {"json": v}) is kept only when
// it was built from references; otherwise the graph still has it.

public enum RequestRecord {
    /// Header names whose values node reads show as `***`.
    public static let maskedHeaders: Set<String> = ["authorization", "cookie", "proxy-authorization"]

    /// The stored form of `request`.
    public static func json(_ request: FetchRequest, keepBody: Bool) -> JSONValue {
        var headers = request.headers.map { JSONMember($0.name, .string($0.value)) }
        if case .json? = request.body, !request.headers.contains(where: { $0.name.lowercased() == "content-type" }) {
            headers.append(JSONMember("Content-Type", "application/json"))
        }
        var members = [
            JSONMember("method", .string(request.method)),
            JSONMember("url", .string(request.url)),
            JSONMember("headers", .object(headers)),
        ]
        if keepBody {
            switch request.body {
            case .text(let s)?: members.append(JSONMember("body", .object([JSONMember("text", .string(s))])))
            case .json(let v)?: members.append(JSONMember("body", .object([JSONMember("json", v)])))
            case nil: break
            }
        }
        return .object(members)
    }

    /// `base` as it was sent, from its stored form; `nil` if `stored` is not one.
    public static func request(from stored: JSONValue, base: FetchRequest) -> FetchRequest? {
        guard let url = stored["url"]?.stringValue, case .object(let headers)? = stored["headers"] else { return nil }
        var request = base
        request.url = url
        var sent: [(name: String, value: String)] = []
        for header in headers {
            guard let value = header.value.stringValue else { return nil }
            sent.append((header.key, value))
        }
        request.headers = sent
        if let body = stored["body"] {
            if let text = body["text"]?.stringValue {
                request.body = .text(text)
            } else if let json = body["json"] {
                request.body = .json(json)
            }
        }
        return request
    }

    /// What node reads show: `{"method", "url", "headers"}` with credential values as `***`.
    public static func shown(_ stored: JSONValue) -> JSONValue {
        var headers: [JSONMember] = []
        if case .object(let members)? = stored["headers"] {
            headers = members.map { member in
                maskedHeaders.contains(member.key.lowercased()) ? JSONMember(member.key, "***") : member
            }
        }
        return .object([
            JSONMember("method", stored["method"] ?? .null),
            JSONMember("url", stored["url"] ?? .null),
            JSONMember("headers", .object(headers)),
        ])
    }
}
