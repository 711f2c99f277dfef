import Foundation
import JobCore

#if canImport(Glibc)
import Glibc
#endif

/// `jobserver submit|get|jobs|cancel|watch`: a client of a running server over HTTP.
///
/// Exit status: 0 the job succeeded (or the request was done), 1 it failed, 3 it was cancelled, 2 a usage error,
/// a connection error or a request the server refused, with a one-line reason on stderr.
struct ClientCommand {
    static let names: Set<String> = ["submit", "get", "jobs", "cancel", "watch"]

    static let usage = """
        Usage: jobserver COMMAND [options]   (a client of a running jobserver)

          submit FILE|- [--wait] [--follow]   submit the job in FILE (- for stdin); --wait waits for its end,
                                              --follow shows its progress until then
          get ID                              print the job
          jobs [--state S] [--limit N]        list jobs, newest first
          cancel ID                           cancel the job
          watch ID                            show the job's progress until it ends

        Options:
          --server URL   the server (default http://127.0.0.1:8080)  [JOBSERVER_URL]
          --token T      send Authorization: Bearer T               [JOBSERVER_TOKEN]

        Exit status: 0 succeeded (or done), 1 failed, 3 cancelled, 2 usage, connection or request error.

        """

    var name: String
    var arguments: [String] = []
    var server = "http://127.0.0.1:8080"
    var token: String?
    var wait = false
    var follow = false
    var state: String?
    var limit: Int?

    /// Parses `arguments` (the command first) over `environment`.
    static func parse(_ arguments: [String], environment: [String: String]) throws -> ClientCommand {
        var args = arguments[...]
        guard let name = args.popFirst(), names.contains(name) else { throw ClientFailure.usage("unknown command") }
        var command = ClientCommand(name: name)
        if let url = environment["JOBSERVER_URL"], !url.isEmpty { command.server = url }
        if let token = environment["JOBSERVER_TOKEN"], !token.isEmpty { command.token = token }
        while let arg = args.popFirst() {
            var flag = arg
            var inlineValue: String?
            if arg.hasPrefix("--"), let equals = arg.firstIndex(of: "=") {
                flag = String(arg[..<equals])
                inlineValue = String(arg[arg.index(after: equals)...])
            }
            func value() throws -> String {
                if let inlineValue { return inlineValue }
                guard let next = args.popFirst() else { throw ClientFailure.usage("\(flag): needs a value") }
                return next
            }
            switch flag {
            case "--server": command.server = try value()
            case "--token": command.token = try value()
            case "--state": command.state = try value()
            case "--limit":
                guard let n = Int(try value()), n > 0 else { throw ClientFailure.usage("--limit: needs a positive integer") }
                command.limit = n
            case "--wait" where name == "submit": command.wait = true
            case "--follow" where name == "submit": command.follow = true
            case "-h", "--help": throw ClientFailure(exitStatus: 0, message: "")
            default:
                if flag.hasPrefix("-") && flag != "-" { throw ClientFailure.usage("\(name): unknown option \(flag)") }
                command.arguments.append(arg)
            }
        }
        while command.server.hasSuffix("/") { command.server.removeLast() }
        guard command.server.hasPrefix("http://") || command.server.hasPrefix("https://") else {
            throw ClientFailure.usage("--server: \"\(command.server)\" is not an http:// or https:// URL")
        }
        let wanted = name == "jobs" ? 0 : 1
        guard command.arguments.count == wanted else {
            throw ClientFailure.usage(wanted == 0 ? "\(name) takes no argument" : "\(name) needs one argument")
        }
        if name != "jobs", command.state != nil || command.limit != nil {
            throw ClientFailure.usage("--state and --limit are options of jobs")
        }
        return command
    }

    /// Runs the command; returns its exit status.
    func run() throws -> Int32 {
        let http = ClientHTTP(baseURL: server, token: token)
        switch name {
        case "submit":
            let body = try readJob(arguments[0])
            let created = try expect(http.send("POST", "/v1/jobs", json: body), [200, 201])
            let job = try parse(created)
            guard wait || follow else {
                print(created.text)
                return 0
            }
            let id = job["id"]?.stringValue ?? ""
            FileHandle.standardError.write(Data("submitted \(id)\n".utf8))
            return try watch(http, job, show: follow)
        case "get":
            let answer = try expect(http.send("GET", "/v1/jobs/\(escaped(arguments[0]))"), [200])
            print(answer.text)
            return 0
        case "jobs":
            var query = ["limit=\(limit ?? 50)"]
            if let state { query.append("state=\(escaped(state))") }
            let answer = try expect(http.send("GET", "/v1/jobs?" + query.joined(separator: "&")), [200])
            let list = try parse(answer)
            for job in list["jobs"]?.arrayValue ?? [] {
                let progress = job["progress"]
                let done = progress?["done"]?.intValue ?? 0
                let total = progress?["total"]?.intValue ?? 0
                let columns = [
                    job["id"]?.stringValue ?? "", pad(job["state"]?.stringValue ?? "", 9), pad("\(done)/\(total)", 11),
                    job["created_at"]?.stringValue ?? "", job["name"]?.stringValue ?? "-",
                ]
                print(columns.joined(separator: "  "))
            }
            return 0
        case "cancel":
            let answer = try expect(http.send("POST", "/v1/jobs/\(escaped(arguments[0]))/cancel"), [200, 202])
            print(answer.text)
            return 0
        default:
            let answer = try expect(http.send("GET", "/v1/jobs/\(escaped(arguments[0]))"), [200])
            return try watch(http, try parse(answer), show: true)
        }
    }

    // MARK: Following a job

    /// Long-polls the job until it is settled; with `show`, draws its progress (in place on a terminal, one line
    /// per change otherwise). Returns the exit status of its final state.
    private func watch(_ http: ClientHTTP, _ first: JSONValue, show: Bool) throws -> Int32 {
        let id = first["id"]?.stringValue ?? ""
        let terminal = isatty(STDOUT_FILENO) == 1
        var job = first
        var lastLine = ""
        var connectionFailures = 0
        while true {
            if show {
                let line = ProgressLine.render(job, terminal: terminal)
                if line != lastLine {
                    if terminal {
                        // Carriage return and erase-line: the line is redrawn where it is.
                        FileHandle.standardOutput.write(Data(("\r\u{1B}[2K" + line).utf8))
                    } else {
                        print(line)
                        fflush(nil)  // every output stream: Swift 6 counts the C `stdout` global as shared state
                    }
                    lastLine = line
                }
            }
            let state = job["state"]?.stringValue ?? ""
            if ["succeeded", "failed", "cancelled", "skipped"].contains(state) {
                if show && terminal { FileHandle.standardOutput.write(Data("\n".utf8)) }
                if let error = job["error"], !error.isNull {
                    let kind = error["kind"]?.stringValue ?? "error"
                    let message = error["message"]?.stringValue ?? ""
                    FileHandle.standardError.write(Data("job \(id) \(state): \(kind): \(message)\n".utf8))
                }
                return state == "succeeded" ? 0 : state == "cancelled" ? 3 : 1
            }
            let version = job["version"]?.intValue ?? 0
            do {
                let answer = try expect(
                    http.send("GET", "/v1/jobs/\(escaped(id))?wait=30&since=\(version)", timeoutSeconds: 45), [200])
                job = try parse(answer)
                connectionFailures = 0
            } catch let failure as ClientFailure where failure.message.hasPrefix("GET ") && connectionFailures < 5 {
                // A server restarting drops the connection; the job is still there when it is back.
                connectionFailures += 1
                usleep(UInt32(200_000 * connectionFailures))
            }
        }
    }

    // MARK: Helpers

    private func readJob(_ path: String) throws -> [UInt8] {
        if path == "-" { return Array(FileHandle.standardInput.readDataToEndOfFile()) }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ClientFailure.usage("cannot read \(path)")
        }
        return Array(data)
    }

    /// `response` if its status is one of `statuses`; else the API error as a one-line failure (exit 2).
    private func expect(_ response: ClientResponse, _ statuses: [Int]) throws -> ClientResponse {
        if statuses.contains(response.status) { return response }
        var reason = "HTTP \(response.status)"
        if let body = try? JSONValue.parse(response.body), let error = body["error"] {
            reason += " \(error["code"]?.stringValue ?? ""): \(error["message"]?.stringValue ?? "")"
            if let path = error["path"]?.stringValue { reason += " (at \(path.isEmpty ? "/" : path))" }
        }
        throw ClientFailure(exitStatus: 2, message: reason)
    }

    private func parse(_ response: ClientResponse) throws -> JSONValue {
        do {
            return try JSONValue.parse(response.body)
        } catch {
            throw ClientFailure(exitStatus: 2, message: "the server's answer is not JSON")
        }
    }

    private func escaped(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/?&="))) ?? text
    }

    private func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
    }
}

/// The one-line picture of a job's progress that `--follow` and `watch` print.
enum ProgressLine {
    static func render(_ job: JSONValue, terminal: Bool) -> String {
        let p = job["progress"]
        func n(_ key: String) -> Int { p?[key]?.intValue ?? 0 }
        let total = n("total")
        let done = n("done")
        let state = job["state"]?.stringValue ?? "?"
        let counts =
            "running \(n("running")) pending \(n("pending")) succeeded \(n("succeeded")) failed \(n("failed")) "
            + "cancelled \(n("cancelled")) skipped \(n("skipped"))"
        guard terminal else {
            return "\(state) \(done)/\(total) \(counts)"
        }
        let width = 24
        let filled = total > 0 ? min(width, done * width / total) : 0
        let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
        let percent = total > 0 ? done * 100 / total : 0
        return "[\(bar)] \(percent)% \(done)/\(total) \(state) · \(counts)"
    }
}

extension ClientCommand {
    /// Parses and runs a client command line; prints the reason of a failure on stderr. Returns the exit status.
    static func main(_ arguments: [String], environment: [String: String]) -> Int32 {
        do {
            return try parse(arguments, environment: environment).run()
        } catch let failure as ClientFailure {
            if failure.exitStatus == 0 && failure.message.isEmpty {
                print(usage, terminator: "")
                return 0
            }
            FileHandle.standardError.write(Data("jobserver \(arguments.first ?? ""): \(failure.message)\n".utf8))
            return failure.exitStatus
        } catch {
            FileHandle.standardError.write(Data("jobserver \(arguments.first ?? ""): \(error)\n".utf8))
            return 2
        }
    }
}
