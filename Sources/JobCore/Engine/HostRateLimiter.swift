import Foundation

/// `--host-rate HOST=N/s`: at most `N` request starts per second to `HOST` (`*`: to each host), over all jobs.
public struct HostRate: Equatable, Sendable, CustomStringConvertible {
    /// A host name or address as it stands in URLs (lowercased, IPv6 without brackets), or `*`.
    public var host: String
    /// Starts per second, more than 0.
    public var perSecond: Double

    /// A rate as given; `host` lowercased as URLs compare.
    public init(host: String, perSecond: Double) {
        self.host = host.lowercased()
        self.perSecond = perSecond
    }

    /// Reads `HOST=N/s` (`N` a positive number, at most 1,000,000).
    /// - Throws: `FetcherError` with the reason.
    public init(parsing text: String) throws {
        let parts = text.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2 else { throw FetcherError("\"\(text)\" is not HOST=N/s (e.g. api.example.com=20/s, *=100/s)") }
        var host = parts[0].trimmingCharacters(in: .whitespaces).lowercased()
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains("/"), !host.contains(" ") else {
            throw FetcherError("\"\(text)\": the host must be a host name, an address or *")
        }
        let rate = parts[1].trimmingCharacters(in: .whitespaces)
        guard rate.hasSuffix("/s"), let n = Double(rate.dropLast(2)), n.isFinite, n > 0, n <= 1_000_000 else {
            throw FetcherError("\"\(text)\": the rate must be N/s with N a number from above 0 to 1000000")
        }
        self.host = host
        self.perSecond = n
    }

    /// `HOST=N/s`.
    public var description: String { "\(host)=\(perSecond)/s" }
}

/// Token buckets of one token per host: consecutive starts to a host are spaced `1/N` s apart (plus 5 %), so no
/// second holds more than `N` of them. The margin keeps the jitter between a start and its arrival upstream
/// (thread wake-ups, a connection being opened) from putting `N + 1` arrivals into one second. Owned by the engine's
/// queue, with `FetchQueue`.
struct HostRateLimiter {
    private var rates: [String: Double] = [:]
    private var wildcard: Double?
    /// The earliest time (monotonic ns) of each limited host's next start.
    private var nextStartNs: [String: UInt64] = [:]

    init(_ rates: [HostRate]) {
        for rate in rates {
            if rate.host == "*" { wildcard = rate.perSecond } else { self.rates[rate.host] = rate.perSecond }
        }
    }

    var isEmpty: Bool { rates.isEmpty && wildcard == nil }

    /// Set when the servers sharing a database book their starts in it (`SharedHostRates`): `take` then lets
    /// every start through and the engine books each one with `perSecond(hostKey:)` instead.
    var booksInStore = false

    /// The rate of `hostKey` (`scheme://host:port`), `nil` when it has none.
    func perSecond(hostKey: String) -> Double? {
        guard !isEmpty else { return nil }
        return rates[HostRateLimiter.hostName(of: hostKey)] ?? wildcard
    }

    /// When a start to `hostKey` (`scheme://host:port`) may happen: `nil` if now (and the start is counted),
    /// else the monotonic time in ns to try again.
    mutating func take(hostKey: String, nowNs: UInt64) -> UInt64? {
        guard !isEmpty, !booksInStore else { return nil }
        let host = HostRateLimiter.hostName(of: hostKey)
        guard let perSecond = rates[host] ?? wildcard else { return nil }
        if let next = nextStartNs[host], next > nowNs { return next }
        nextStartNs[host] = nowNs + UInt64(1e9 / perSecond * 1.05)
        return nil
    }

    /// The host of `scheme://host:port`, without port or IPv6 brackets.
    static func hostName(of hostKey: String) -> String {
        var rest = Substring(hostKey)
        if let scheme = rest.range(of: "://") { rest = rest[scheme.upperBound...] }
        if rest.hasPrefix("[") {
            return String(rest.dropFirst().prefix { $0 != "]" })
        }
        return String(rest.prefix { $0 != ":" })
    }

    static func nowNs() -> UInt64 { DispatchTime.now().uptimeNanoseconds }
}
