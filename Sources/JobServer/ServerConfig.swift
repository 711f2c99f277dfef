import Foundation
import HTTPServer
import JobCore

/// Everything `jobserver serve` can be told, from flags and `JOBSERVER_*` variables (API.md §4).
struct ServerConfig: Equatable {
    var host = "0.0.0.0"
    var port = 8080
    var dbPath = "./data/jobserver.sqlite"
    /// True when `--db` names a PostgreSQL database (a `postgres://` or `postgresql://` URL) rather than a SQLite file.
    var usesPostgres: Bool { dbPath.hasPrefix("postgres://") || dbPath.hasPrefix("postgresql://") }
    var token: String?
    var maxRequestBytes = 1 << 20
    var maxNodes = 10_000
    var maxDepth = 64
    var maxResponseBytes = 10 << 20
    /// `--max-job-bytes`: the response body bytes one job's fetches may receive together (0: no budget).
    var maxJobBytes = 64 << 20
    /// `--max-response-memory`: the response body bytes all jobs in memory may hold together (0: no bound).
    var maxResponseMemory = 64 << 20
    var maxConcurrentFetches = 256
    var maxPerHost = 16
    var denyCIDRs = ["169.254.0.0/16"]
    /// Extra trusted roots for HTTPS fetches (PEM); certificates and host names are verified either way.
    var caFile: String?
    /// `--host-rate`: request starts per second per host.
    var hostRates: [HostRate] = []
    /// `--cache-bytes`: the HTTP cache's bound in the store (0: nothing is stored).
    var cacheBytes = 64 << 20
    /// Settled jobs older than this are deleted; 0 keeps them forever.
    var retentionMs: Int64 = 7 * 86_400_000
    var shutdownGraceMs = 10_000
    /// `--lease-ttl`: how long a server's hold on a job lasts without renewal on PostgreSQL (API.md §10).
    var leaseTtlMs: Int64 = 15_000
    /// The longest a whole request (head and body) may take to arrive before `408`.
    var requestTimeoutMs: Int64 = 30_000
    var maxActiveJobs = 10_000
    /// The nodes the jobs in memory may hold together; a job over it waits in the store (`NodeRoom`). 0: no bound.
    var maxActiveNodes = 20_000
    var settledCacheBytes = 64 << 20
    var logLevel = Logger.Level.info
    /// Signs webhook bodies with HMAC-SHA256 under this key.
    var webhookSecret: String?
    /// Failed webhook deliveries are retried until this long after the job settled.
    var webhookRetryForMs: Int64 = 86_400_000
    /// A stored settled job's answer, or its node list with results, about this large or larger is written to a
    /// temporary file beside the SQLite file and sent from there (`AnswerSpool`; tests lower it). No flag. So is a
    /// node list without results, live or stored.
    var spoolAnswerBytes = 8 << 20
    /// A settled job's answer made from a result that is a list of this many entries or more is written on every
    /// core at once (`EngineConfiguration.answerRunsMinimumEntries`; tests lower it). No flag.
    var answerRunsMinimumEntries = EngineConfiguration().answerRunsMinimumEntries
    /// Where large answers are written: beside the SQLite file (on PostgreSQL, none is: no answer is written from
    /// the rows there, and a node list is made in memory).
    var answerSpool: AnswerSpool {
        AnswerSpool(
            directory: usesPostgres ? nil : URL(fileURLWithPath: dbPath).deletingLastPathComponent().path,
            thresholdBytes: spoolAnswerBytes)
    }
    /// How often an event stream gets a keep-alive comment (API.md §8 says 15 s; tests shorten it). No flag.
    var eventsKeepAliveMs = 15_000
}

/// What the command line asks for.
enum Command: Equatable {
    case serve(ServerConfig)
    case help
}

/// A command line or environment value that cannot be used; `jobserver` exits 2 with it.
struct ConfigError: Error, Equatable, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// Parses the command line and environment into a `Command`.
enum CommandLineParser {
    /// One option: its flag, how it is read, and where it goes.
    private struct Option: Sendable {
        var flag: String
        var help: String
        var apply: @Sendable (inout ServerConfig, String, Bool) throws -> Void

        /// `--max-per-host` ↔ `JOBSERVER_MAX_PER_HOST`.
        var environmentName: String {
            "JOBSERVER_" + flag.dropFirst(2).uppercased().replacingOccurrences(of: "-", with: "_")
        }
    }

    private static let options: [Option] = [
        Option(flag: "--host", help: "address to listen on (default 0.0.0.0)") { c, v, _ in
            guard !v.isEmpty else { throw ConfigError(message: "--host: must not be empty") }
            c.host = v
        },
        Option(flag: "--port", help: "TCP port, 0 for any free one (default 8080)") { c, v, _ in
            c.port = try integer(v, flag: "--port", in: 0...65535)
        },
        Option(
            flag: "--db",
            help: "SQLite file, created with its folder, or a postgres:// URL (default ./data/jobserver.sqlite)"
        ) { c, v, _ in
            guard !v.isEmpty else { throw ConfigError(message: "--db: must not be empty") }
            c.dbPath = v
        },
        Option(flag: "--token", help: "require Authorization: Bearer <token> (default: no auth)") { c, v, _ in
            c.token = v.isEmpty ? nil : v
        },
        Option(flag: "--max-request-bytes", help: "largest request body (default 1MiB)") { c, v, _ in
            c.maxRequestBytes = try size(v, flag: "--max-request-bytes")
        },
        Option(flag: "--max-nodes", help: "nodes per job (default 10000)") { c, v, _ in
            c.maxNodes = try integer(v, flag: "--max-nodes", in: 1...Limits.maxNodesCeiling)
        },
        Option(flag: "--max-depth", help: "nesting depth per job (default 64)") { c, v, _ in
            c.maxDepth = try integer(v, flag: "--max-depth", in: 1...Limits.maxDepthCeiling)
        },
        Option(flag: "--max-response-bytes", help: "largest fetched response (default 10MiB)") { c, v, _ in
            c.maxResponseBytes = try size(v, flag: "--max-response-bytes")
        },
        Option(
            flag: "--max-job-bytes",
            help: "response bytes one job's fetches may receive together, retries and pages included (default 64MiB; 0 = no limit)"
        ) { c, v, _ in
            c.maxJobBytes = v.trimmingCharacters(in: .whitespaces) == "0" ? 0 : try size(v, flag: "--max-job-bytes")
        },
        Option(
            flag: "--max-response-memory",
            help: "response bytes all jobs in memory may hold together (default 64MiB; 0 = no limit)"
        ) { c, v, _ in
            c.maxResponseMemory =
                v.trimmingCharacters(in: .whitespaces) == "0" ? 0 : try size(v, flag: "--max-response-memory")
        },
        Option(flag: "--max-concurrent-fetches", help: "transfers at once (default 256)") { c, v, _ in
            c.maxConcurrentFetches = try integer(v, flag: "--max-concurrent-fetches", in: 1...1_000_000)
        },
        Option(flag: "--max-per-host", help: "transfers at once per host (default 16)") { c, v, _ in
            c.maxPerHost = try integer(v, flag: "--max-per-host", in: 1...1_000_000)
        },
        Option(
            flag: "--deny-cidr",
            help: "refuse fetches to these addresses; repeatable or comma-separated, \"\" for none (default 169.254.0.0/16)"
        ) { c, v, first in
            if first { c.denyCIDRs = [] }
            for part in v.split(separator: ",") {
                let cidr = part.trimmingCharacters(in: .whitespaces)
                guard !cidr.isEmpty else { continue }
                guard isValidCIDR(cidr) else { throw ConfigError(message: "--deny-cidr: \"\(cidr)\" is not a CIDR block") }
                c.denyCIDRs.append(cidr)
            }
        },
        Option(flag: "--ca-file", help: "PEM certificates trusted as roots for https fetches, besides the system's") {
            c, v, _ in
            do {
                try FetcherConfiguration.checkCAFile(v)
            } catch {
                throw ConfigError(message: "\(error)")
            }
            c.caFile = v
        },
        Option(
            flag: "--host-rate",
            help: "at most N request starts per second to HOST over all jobs: HOST=N/s, * for each host; repeatable or comma-separated"
        ) { c, v, first in
            if first { c.hostRates = [] }
            for part in v.split(separator: ",") {
                let text = part.trimmingCharacters(in: .whitespaces)
                guard !text.isEmpty else { continue }
                let rate: HostRate
                do {
                    rate = try HostRate(parsing: text)
                } catch {
                    throw ConfigError(message: "--host-rate: \(error)")
                }
                guard !c.hostRates.contains(where: { $0.host == rate.host }) else {
                    throw ConfigError(message: "--host-rate: \(rate.host) is given twice")
                }
                c.hostRates.append(rate)
            }
        },
        Option(flag: "--cache-bytes", help: "HTTP cache of cache: \"use\" fetches, in the store (default 64MiB; 0 = none)") {
            c, v, _ in
            c.cacheBytes = v.trimmingCharacters(in: .whitespaces) == "0" ? 0 : try size(v, flag: "--cache-bytes")
        },
        Option(flag: "--retention", help: "delete settled jobs older than this: 7d, 12h, 30m, 45s, 0 = never (default 7d)") {
            c, v, _ in
            c.retentionMs = try duration(v, flag: "--retention")
        },
        Option(flag: "--shutdown-grace", help: "time to finish on SIGTERM (default 10s)") { c, v, _ in
            c.shutdownGraceMs = Int(try duration(v, flag: "--shutdown-grace"))
        },
        Option(
            flag: "--lease-ttl",
            help: "with a postgres:// --db: a dead server's jobs are taken over this long after its last heartbeat, 1s to 1h (default 15s)"
        ) { c, v, _ in
            let ms = try duration(v, flag: "--lease-ttl")
            guard (1_000...3_600_000).contains(ms) else { throw ConfigError(message: "--lease-ttl: must be from 1s to 1h") }
            c.leaseTtlMs = ms
        },
        Option(flag: "--request-timeout", help: "time to receive a whole request, head and body (default 30s)") {
            c, v, _ in
            let ms = try duration(v, flag: "--request-timeout")
            guard ms > 0 else { throw ConfigError(message: "--request-timeout: must be more than 0") }
            c.requestTimeoutMs = ms
        },
        Option(flag: "--max-active-jobs", help: "pending and running jobs before 429 (default 10000)") { c, v, _ in
            c.maxActiveJobs = try integer(v, flag: "--max-active-jobs", in: 1...100_000_000)
        },
        Option(flag: "--max-active-nodes", help: "nodes of the jobs in memory; more jobs wait (default 20000; 0 = no bound)") {
            c, v, _ in
            c.maxActiveNodes = try integer(v, flag: "--max-active-nodes", in: 0...100_000_000)
        },
        Option(
            flag: "--settled-cache-bytes",
            help: "settled jobs' answers kept in memory, and results written ahead for long-polls (default 64MiB; 0 = none)"
        ) { c, v, _ in
            c.settledCacheBytes = v.trimmingCharacters(in: .whitespaces) == "0" ? 0 : try size(v, flag: "--settled-cache-bytes")
        },
        Option(flag: "--webhook-secret", help: "sign notify webhooks: X-Jobserver-Signature: sha256=<HMAC> (default: unsigned)") {
            c, v, _ in
            c.webhookSecret = v.isEmpty ? nil : v
        },
        Option(flag: "--webhook-retry-for", help: "retry a failed notify webhook for this long after the job settled (default 24h)") {
            c, v, _ in
            let ms = try duration(v, flag: "--webhook-retry-for")
            guard ms > 0 else { throw ConfigError(message: "--webhook-retry-for: must be more than 0") }
            c.webhookRetryForMs = ms
        },
        Option(flag: "--log-level", help: "debug, info, warning or error (default info)") { c, v, _ in
            switch v.lowercased() {
            case "debug": c.logLevel = .debug
            case "info": c.logLevel = .info
            case "warning", "warn": c.logLevel = .warning
            case "error": c.logLevel = .error
            default: throw ConfigError(message: "--log-level: \"\(v)\" is not one of debug, info, warning, error")
            }
        },
    ]

    /// The `--help` text.
    static var usage: String {
        var text = """
            Usage: jobserver [serve] [options]

            Runs job graphs of HTTP fetches and serves the jobserver HTTP API.
            Every option can also be set by its environment variable; the flag wins.

            Options:

            """
        for option in options {
            let left = "  \(option.flag) <value>"
            text += left.padding(toLength: max(left.count + 1, 36), withPad: " ", startingAt: 0)
            text += "\(option.help)  [\(option.environmentName)]\n"
        }
        text += "  -h, --help                        show this text\n"
        return text
    }

    /// Parses `arguments` (without the program name) over `environment`; flags win over variables.
    /// - Throws: `ConfigError` for an unknown flag or subcommand, a missing or bad value.
    static func parse(_ arguments: [String], environment: [String: String]) throws -> Command {
        var args = arguments[...]
        if let first = args.first, !first.hasPrefix("-") {
            switch first {
            case "serve": args = args.dropFirst()
            case "help": return .help
            default: throw ConfigError(message: "unknown command \"\(first)\" (try --help)")
            }
        }
        var config = ServerConfig()
        for option in options {
            if let value = environment[option.environmentName] {
                do {
                    try option.apply(&config, value, true)
                } catch let error as ConfigError {
                    throw ConfigError(message: "\(option.environmentName): \(error.message)")
                }
            }
        }
        var seen: Set<String> = []
        while let arg = args.popFirst() {
            if arg == "-h" || arg == "--help" { return .help }
            let flag: String
            let value: String
            if let equals = arg.firstIndex(of: "="), arg.hasPrefix("--") {
                flag = String(arg[..<equals])
                value = String(arg[arg.index(after: equals)...])
            } else {
                flag = arg
                guard options.contains(where: { $0.flag == flag }) else {
                    throw ConfigError(message: "unknown option \"\(arg)\" (try --help)")
                }
                guard let next = args.popFirst() else { throw ConfigError(message: "\(flag): needs a value") }
                value = next
            }
            guard let option = options.first(where: { $0.flag == flag }) else {
                throw ConfigError(message: "unknown option \"\(flag)\" (try --help)")
            }
            try option.apply(&config, value, seen.insert(flag).inserted)
        }
        return .serve(config)
    }

    /// A decimal integer within `range`.
    static func integer(_ text: String, flag: String, in range: ClosedRange<Int>) throws -> Int {
        guard let value = Int(text), range.contains(value) else {
            throw ConfigError(
                message: "\(flag): \"\(text)\" is not an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return value
    }

    /// A byte count: `1048576`, `512k`, `512KiB`, `10m`, `10MiB`, `1g`, `1GiB` (powers of 1024), at least 1.
    static func size(_ text: String, flag: String) throws -> Int {
        let units: [(String, Int)] = [
            ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("k", 1 << 10), ("K", 1 << 10),
            ("m", 1 << 20), ("M", 1 << 20), ("g", 1 << 30), ("G", 1 << 30),
        ]
        var digits = Substring(text.trimmingCharacters(in: .whitespaces))
        var multiplier = 1
        for (suffix, factor) in units where digits.hasSuffix(suffix) {
            digits = digits.dropLast(suffix.count)
            multiplier = factor
            break
        }
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(digits), n > 0 else {
            throw ConfigError(message: "\(flag): \"\(text)\" is not a size such as 1048576, 512KiB or 10MiB")
        }
        let (bytes, overflow) = n.multipliedReportingOverflow(by: multiplier)
        guard !overflow, bytes <= Int(Int32.max) * 8 else { throw ConfigError(message: "\(flag): \"\(text)\" is too large") }
        return bytes
    }

    /// A duration in milliseconds: `0`, or a whole number with `ms`, `s`, `m`, `h` or `d`.
    static func duration(_ text: String, flag: String) throws -> Int64 {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed == "0" { return 0 }
        let units: [(String, Int64)] = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]
        for (suffix, factor) in units where trimmed.hasSuffix(suffix) {
            let digits = trimmed.dropLast(suffix.count)
            guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int64(digits) else { break }
            let (ms, overflow) = n.multipliedReportingOverflow(by: factor)
            guard !overflow, ms <= 100 * 365 * 86_400_000 else { break }
            return ms
        }
        throw ConfigError(message: "\(flag): \"\(text)\" is not a duration such as 7d, 12h, 30m, 45s, 500ms or 0")
    }

    /// `a.b.c.d/n` (n ≤ 32) or an IPv6 address with `/n` (n ≤ 128).
    static func isValidCIDR(_ text: String) -> Bool {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, let bits = Int(parts[1]), parts[1].allSatisfy({ $0.isASCII && $0.isNumber }) else {
            return false
        }
        let address = String(parts[0])
        var v4 = in_addr()
        if inet_pton(AF_INET, address, &v4) == 1 { return (0...32).contains(bits) }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, address, &v6) == 1 { return (0...128).contains(bits) }
        return false
    }
}

extension ServerConfig {
    /// The limits every job body is held to.
    var graphLimits: Limits {
        var limits = Limits()
        limits.maxNodes = maxNodes
        limits.maxDepth = maxDepth
        limits.maxResponseBytes = maxResponseBytes
        return limits
    }

    /// The engine's settings.
    var engineConfiguration: EngineConfiguration {
        var c = EngineConfiguration()
        c.limits = graphLimits
        c.maxActiveJobs = maxActiveJobs
        c.maxActiveNodes = maxActiveNodes
        c.maxConcurrentFetches = maxConcurrentFetches
        c.maxPerHost = maxPerHost
        c.retentionMs = retentionMs
        c.settledCacheBytes = settledCacheBytes
        c.answerRunsMinimumEntries = answerRunsMinimumEntries
        c.maxJobBytes = maxJobBytes
        c.maxResponseMemory = maxResponseMemory
        c.hostRates = hostRates
        return c
    }

    /// The fetcher's settings.
    var webhookConfiguration: WebhookConfiguration {
        var c = WebhookConfiguration()
        c.secret = webhookSecret.map { Array($0.utf8) }
        c.retryForMs = webhookRetryForMs
        return c
    }

    var fetcherConfiguration: FetcherConfiguration {
        var c = FetcherConfiguration()
        c.maxConcurrentFetches = maxConcurrentFetches
        c.maxPerHost = maxPerHost
        c.maxResponseBytes = maxResponseBytes
        c.denyCIDRs = denyCIDRs
        c.caFile = caFile
        return c
    }

    /// The HTTP server's settings (without `onResponse`, which the app sets).
    var httpConfiguration: HTTPServerConfiguration {
        var c = HTTPServerConfiguration()
        c.host = host
        c.port = port
        c.maxRequestBodyBytes = maxRequestBytes
        c.requestTimeoutSeconds = Double(requestTimeoutMs) / 1000
        return c
    }
}
