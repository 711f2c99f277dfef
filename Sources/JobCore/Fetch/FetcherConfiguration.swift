#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Limits and policy shared by every transfer of one `Fetcher` (API.md §4 flags).
public struct FetcherConfiguration: Sendable {
    /// Connections open at once over all hosts (`--max-concurrent-fetches`); more transfers wait in line.
    public var maxConcurrentFetches = 256
    /// Connections open at once to one host (`--max-per-host`).
    public var maxPerHost = 16
    /// The body limit of a request that has no `maxBytes` (`--max-response-bytes`).
    public var maxResponseBytes = 10 * 1024 * 1024
    /// Address ranges no connection may be opened to (`--deny-cidr`), IPv4 or IPv6
    /// (`a.b.c.d/n`, `x:y::z/n`, or a bare address); checked on the resolved
    /// address as what it reaches (`AddressRange.denial(of:by:)`).
    public var denyCIDRs: [String] = ["169.254.0.0/16"]
    /// The connect phase's limit per attempt.
    public var connectTimeoutMs = 10_000
    /// The proxy for every transfer; `nil` means none (the environment's `http_proxy` is ignored).
    /// With a proxy, the deny list applies to the proxy's address.
    public var proxy: String? = nil
    /// The `User-Agent` sent unless a request sets its own.
    public var userAgent = "jobserver/1"
    /// A PEM file of certificates trusted as roots besides the system's (`--ca-file`). Certificate and host
    /// name are verified on every TLS connection whatever this says.
    public var caFile: String? = nil

    /// The defaults of API.md §4.
    public init() {}
}

/// Why a `Fetcher` could not be created.
public struct FetcherError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The reason, in words.
    public var message: String
    /// Wraps a message.
    public init(_ message: String) { self.message = message }
    /// The message.
    public var description: String { message }
}

/// One range of addresses, as given by a CIDR such as `169.254.0.0/16` or `fd00::/8`.
public struct AddressRange: Equatable, Sendable, CustomStringConvertible {
    /// The network's bytes: 4 for IPv4, 16 for IPv6.
    public let network: [UInt8]
    /// The number of leading bits that must match.
    public let prefixLength: Int
    /// The text it was parsed from.
    public let description: String

    /// Parses `address/prefix` or a bare address (a single host).
    /// - Throws: `FetcherError` when the text is not a valid IPv4 or IPv6 CIDR.
    public init(cidr: String) throws {
        let parts = cidr.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 1 || parts.count == 2 else { throw FetcherError("invalid CIDR \"\(cidr)\"") }
        let addressText = String(parts[0])
        guard let bytes = AddressRange.parseAddress(addressText) else {
            throw FetcherError("invalid CIDR \"\(cidr)\": \"\(addressText)\" is not an IPv4 or IPv6 address")
        }
        let maxBits = bytes.count * 8
        var prefix = maxBits
        if parts.count == 2 {
            guard let n = Int(parts[1]), n >= 0, n <= maxBits, parts[1].allSatisfy({ $0.isASCII && $0.isNumber }) else {
                throw FetcherError("invalid CIDR \"\(cidr)\": prefix length must be 0–\(maxBits)")
            }
            prefix = n
        }
        self.network = bytes
        self.prefixLength = prefix
        self.description = cidr
    }

    /// Whether `address` (4 or 16 bytes) lies in the range. An IPv4-mapped IPv6
    /// address (`::ffff:a.b.c.d`) is matched against IPv4 ranges as its IPv4 address.
    public func contains(_ address: [UInt8]) -> Bool {
        var candidate = address
        if candidate.count == 16, network.count == 4, candidate[0..<10].allSatisfy({ $0 == 0 }),
            candidate[10] == 0xff, candidate[11] == 0xff
        {
            candidate = Array(candidate[12..<16])
        }
        guard candidate.count == network.count else { return false }
        var bitsLeft = prefixLength
        var index = 0
        while bitsLeft > 0 {
            let take = min(8, bitsLeft)
            let mask = UInt8(truncatingIfNeeded: 0xff << (8 - take))
            if candidate[index] & mask != network[index] & mask { return false }
            bitsLeft -= take
            index += 1
        }
        return true
    }

    /// Why a connection to `address` (4 or 16 bytes) is refused by `ranges`, or
    /// `nil` when it is allowed. The address is checked as what a connection
    /// to it reaches:
    /// - an IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible (`::a.b.c.d`)
    ///   IPv6 address also as its IPv4 address;
    /// - an unspecified address (`0.0.0.0/8`, `::`, or either inside an IPv6
    ///   form) reaches this host (Linux connects `0.0.0.0` to `127.0.0.1` and
    ///   `::` to `::1`), so it is also checked as `127.0.0.1` and `::1`: it is
    ///   refused whenever a range holding either loopback address is denied.
    public static func denial(of address: [UInt8], by ranges: [AddressRange]) -> String? {
        guard !ranges.isEmpty else { return nil }
        var candidates = [address]
        var v4: [UInt8]?
        if address.count == 4 {
            v4 = address
        } else if address.count == 16, address[0..<10].allSatisfy({ $0 == 0 }) {
            let mapped = address[10] == 0xff && address[11] == 0xff
            let compatible = address[10] == 0 && address[11] == 0
            // ::1 is the IPv6 loopback, not the IPv4-compatible 0.0.0.1.
            if mapped || (compatible && address != loopback6) { v4 = Array(address[12..<16]) }
        }
        var unspecified = false
        if let v4 {
            // The IPv4 form first, so the message names it.
            if v4 != address { candidates.insert(v4, at: 0) }
            unspecified = v4[0] == 0
        }
        if unspecified {
            candidates.append(loopback4)
            candidates.append(loopback6)
        }
        for candidate in candidates {
            guard let range = ranges.first(where: { $0.contains(candidate) }) else { continue }
            let shown = format(address)
            if candidate == address { return "address \(shown) is denied (\(range))" }
            if unspecified, candidate == loopback4 || candidate == loopback6 {
                return "address \(shown) reaches this host and is denied as \(format(candidate)) (\(range))"
            }
            return "address \(shown) is denied as \(format(candidate)) (\(range))"
        }
        return nil
    }

    private static let loopback4: [UInt8] = [127, 0, 0, 1]
    private static let loopback6: [UInt8] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]

    /// The 4 or 16 bytes of a textual IPv4 or IPv6 address, or `nil`.
    public static func parseAddress(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            return withUnsafeBytes(of: &v4) { Array($0) }
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 {
            return withUnsafeBytes(of: &v6) { Array($0) }
        }
        return nil
    }

    /// The usual text of a 4- or 16-byte address.
    static func format(_ bytes: [UInt8]) -> String {
        var buffer = [CChar](repeating: 0, count: 64)
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        let ok = bytes.withUnsafeBytes { raw in
            inet_ntop(family, raw.baseAddress, &buffer, socklen_t(buffer.count)) != nil
        }
        guard ok else { return bytes.map(String.init).joined(separator: ".") }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
