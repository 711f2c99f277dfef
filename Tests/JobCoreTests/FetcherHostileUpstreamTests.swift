import Foundation
import JobCore
import TestSupport
import XCTest

#if canImport(Glibc)
import Glibc
#endif

/// What an upstream can do to a fetch: every error kind it can cause, encoded
/// bodies and bombs, oversized headers, redirect loops, and addresses that
/// reach this host under another name.
final class FetcherHostileUpstreamTests: FetcherTestCase {
    /// One row per kind an upstream (or the way to it) can cause; `cancelled`
    /// is FetcherCancelTests' and `resource_exhausted` is
    /// `testDescriptorExhaustionIsResourceExhaustedAndRetried`'s.
    func testEveryFetchErrorKindFromAHostileUpstream() throws {
        let refused = try closedPort()
        let rows: [(String, FetchRequest, ErrorKind, String)] = [
            ("503", FetchRequest(url: upstream.url("/status/503")), .httpStatus, "answered 503"),
            ("slow", FetchRequest(url: upstream.url("/delay/5000")), .timeout, "timed out"),
            ("reset", FetchRequest(url: upstream.url("/reset")), .connect, ""),
            ("closed without answer", FetchRequest(url: upstream.url("/close")), .connect, ""),
            ("not HTTP", FetchRequest(url: upstream.url("/garbage")), .connect, "not HTTP"),
            ("refused", FetchRequest(url: "http://127.0.0.1:\(refused)/"), .connect, ""),
            ("unresolvable", FetchRequest(url: "http://nonexistent.invalid/"), .dns, ""),
            ("TLS to a plain-HTTP server", FetchRequest(url: "https://127.0.0.1:\(upstream.port)/json"), .tls, ""),
            ("body over max_bytes", FetchRequest(url: upstream.url("/bytes/2000"), maxBytes: 1000), .tooLarge, "larger than 1000 bytes"),
            ("gzip bomb", FetchRequest(url: upstream.url("/gzip/bomb")), .tooLarge, "larger than 10485760 bytes"),
            ("200 KiB header line", FetchRequest(url: upstream.url("/big-header")), .tooLarge, "header line"),
            ("5 MB of headers", FetchRequest(url: upstream.url("/many-headers")), .tooLarge, "header section"),
            ("redirect loop", FetchRequest(url: upstream.url("/loop")), .tooManyRedirects, "too many redirects"),
            ("broken JSON", FetchRequest(url: upstream.url("/invalid-json"), expect: .json), .invalidJSON, "not valid JSON"),
        ]
        var seen: Set<ErrorKind> = []
        for (name, request, kind, words) in rows {
            let outcome = try XCTUnwrap(fetchAndWait(fetcher, request, timeoutMs: name == "slow" ? 300 : nil), name)
            let error = try XCTUnwrap(outcome.error, "\(name) succeeded")
            XCTAssertEqual(error.kind, kind, "\(name): \(error.message)")
            XCTAssertTrue(words.isEmpty || error.message.contains(words), "\(name): \(error.message)")
            XCTAssertTrue(error.message.hasPrefix("GET \(request.url)"), "\(name): \(error.message)")
            seen.insert(error.kind)
        }
        let produced: Set<ErrorKind> = [.httpStatus, .timeout, .connect, .dns, .tls, .tooLarge, .tooManyRedirects, .invalidJSON]
        XCTAssertEqual(seen, produced)
        XCTAssertNil(fetcher.stats.outcomes["internal"])
        XCTAssertEqual(fetcher.inFlight, 0)
    }

    // MARK: encoded bodies

    func testGzipBodiesAreDecodedAndReadAsTheirType() throws {
        let json = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/json")))?.response)
        XCTAssertEqual(json.header("content-encoding"), "gzip")
        XCTAssertEqual(json.body, .object(["gzipped": true]))
        XCTAssertEqual(json.bodyEncoding, "json")
        XCTAssertEqual(json.rawBody, Array(#"{"gzipped":true}"#.utf8))
        XCTAssertEqual(json.bytes, 16, "bytes counts the decoded body")

        let strict = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/json"), expect: .json))?.response)
        XCTAssertEqual(strict.body, .object(["gzipped": true]))

        let text = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/text")))?.response)
        XCTAssertEqual(text.header("content-encoding"), "gzip")
        XCTAssertEqual(text.body, "hello, gzip")
        XCTAssertEqual(text.bodyEncoding, "text")

        // An upstream that encodes although the request asked for identity.
        let forced = try XCTUnwrap(fetchAndWait(
            fetcher, FetchRequest(url: upstream.url("/gzip/forced"), headers: [("Accept-Encoding", "identity")]))?.response)
        XCTAssertEqual(forced.header("content-encoding"), "gzip")
        XCTAssertEqual(forced.body, .object(["forced": true]))
        XCTAssertEqual(forced.bodyEncoding, "json")
    }

    func testMaxBytesCountsDecodedBytes() throws {
        // About 40 bytes on the wire either way: only the decoded size can tell these apart.
        let exact = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/json?size=1000"), maxBytes: 1000)))
        XCTAssertEqual(exact.response?.bytes, 1000)
        XCTAssertEqual(exact.response?.header("content-encoding"), "gzip")
        let over = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/json?size=1001"), maxBytes: 1000)))
        XCTAssertEqual(over.error?.kind, .tooLarge)
        XCTAssertEqual(over.error?.message.contains("larger than 1000 bytes"), true, over.error?.message ?? "")
    }

    func testGzipBombFailsTooLargeWithFlatMemory() throws {
        let before = try residentKiB()
        // 100 MiB of zeros in about 100 KB: decoding stops at the 10 MiB default.
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/bomb"), expect: .bytes)))
        XCTAssertEqual(outcome.error?.kind, .tooLarge)
        let small = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/gzip/bomb?mib=1"), maxBytes: 65536)))
        XCTAssertEqual(small.error?.kind, .tooLarge)
        let after = try residentKiB()
        if !rssBoundsMeaningless {
            XCTAssertLessThan(after - before, 50 * 1024, "RSS grew from \(before) KiB to \(after) KiB")
        }
    }

    func testEncodingsAreOffered() throws {
        let echo = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/echo")))?.response?.body)
        let offered = try XCTUnwrap(echo["headers"]?["accept-encoding"]?.stringValue)
        XCTAssertTrue(offered.contains("gzip"), offered)
        // A node's own header wins.
        let own = try XCTUnwrap(fetchAndWait(
            fetcher, FetchRequest(url: upstream.url("/echo"), headers: [("Accept-Encoding", "identity")]))?.response?.body)
        XCTAssertEqual(own["headers"]?["accept-encoding"], "identity")
        let plain = try XCTUnwrap(fetchAndWait(
            fetcher, FetchRequest(url: upstream.url("/gzip/json"), headers: [("Accept-Encoding", "identity")]))?.response)
        XCTAssertNil(plain.header("content-encoding"))
        XCTAssertEqual(plain.body, .object(["gzipped": true]))
    }

    // MARK: headers and redirects

    func testOversizedHeadersAreTooLargeAndModestOnesPass() throws {
        let line = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/big-header?kib=200"))))
        XCTAssertEqual(line.error?.kind, .tooLarge, line.error?.message ?? "succeeded")
        let section = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/many-headers?count=6&kib=50"))))
        XCTAssertEqual(section.error?.kind, .tooLarge, section.error?.message ?? "succeeded")
        XCTAssertEqual(section.error?.message.contains("header section larger than 262144 bytes"), true)
        let modest = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/many-headers?count=4&kib=50")))?.response)
        XCTAssertEqual(modest.header("x-many-3")?.count, 50 * 1024)
        let oneLine = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/big-header?kib=90")))?.response)
        XCTAssertEqual(oneLine.header("x-big")?.count, 90 * 1024)
    }

    func testRedirectLoopIsTooManyRedirectsAndNotRetried() throws {
        let outcome = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/loop"), retries: 3, retryBackoffMs: 1)))
        XCTAssertEqual(outcome.error?.kind, .tooManyRedirects)
        XCTAssertEqual(outcome.attempts, 1)
        XCTAssertEqual(try upstream.stats()["requests"]?.intValue, 6, "the first request and 5 redirects")
    }

    // MARK: local resources

    func testDescriptorExhaustionIsResourceExhaustedAndRetried() throws {
        var saved = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved) == 0 else { throw UpstreamError("getrlimit failed") }
        let open = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").compactMap { Int($0) }
        let highest = open.max() ?? 2
        // A soft limit just above what is open keeps the filling short.
        var lowered = saved
        lowered.rlim_cur = min(saved.rlim_cur, rlim_t(highest + 64))
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &lowered) == 0 else { throw UpstreamError("setrlimit failed") }
        let fillers = FillerDescriptors()
        defer {
            fillers.closeAll()
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved)
        }
        try fillers.fill(limit: highest + 64)

        let exhausted = try XCTUnwrap(fetchAndWait(fetcher, FetchRequest(url: upstream.url("/json"))))
        let error = try XCTUnwrap(exhausted.error)
        XCTAssertEqual(error.kind, .resourceExhausted, error.message)
        XCTAssertTrue(error.message.contains("EMFILE"), error.message)

        // The second attempt finds descriptors again: the kind is retried.
        let retried = try XCTUnwrap(fetchAndWait(
            fetcher, FetchRequest(url: upstream.url("/json"), retries: 1, retryBackoffMs: 1),
            onAttempt: { if $0 == 2 { fillers.closeAll() } }))
        XCTAssertEqual(retried.response?.status, 200, retried.error?.message ?? "")
        XCTAssertEqual(retried.attempts, 2)
    }

    // MARK: addresses that reach this host

    /// With loopback denied, every spelling of "this host" is refused before a
    /// connection: the fixture (127.0.0.1) and a listener on ::1 see none.
    func testUnspecifiedMappedAndCompatibleFormsOfLoopbackAreDenied() throws {
        let port = upstream.port
        let v6 = try LoopbackV6Listener(port: port)
        defer { v6.close() }

        // Allowed, these forms do connect to this host, so refusing them is the deny list's doing.
        let open = try Fetcher(configuration: FetcherConfiguration())
        defer { open.shutdown() }
        for host in ["0.0.0.0", "[::ffff:127.0.0.1]", "[::ffff:0.0.0.0]"] {
            let outcome = try XCTUnwrap(fetchAndWait(open, FetchRequest(url: "http://\(host):\(port)/json")))
            XCTAssertEqual(outcome.response?.status, 200, "\(host): \(outcome.error?.message ?? "")")
        }
        _ = fetchAndWait(open, FetchRequest(url: "http://[::]:\(port)/json"), timeoutMs: 200)
        XCTAssertTrue(v6.acceptPending(), "[::] reaches ::1")
        try upstream.resetStats()

        var configuration = FetcherConfiguration()
        configuration.denyCIDRs = ["127.0.0.0/8", "::1/128"]
        let denying = try Fetcher(configuration: configuration)
        defer { denying.shutdown() }
        let forms = [
            "0.0.0.0", "0.1.2.3", "[::ffff:0.0.0.0]", "[::ffff:127.0.0.1]", "[::ffff:7f00:2]", "[::]", "[::127.0.0.1]",
            "[::0.0.0.0]", "[::1]", "127.1", "2130706433",
        ]
        for host in forms {
            let url = "http://\(host):\(port)/count/denied"
            let outcome = try XCTUnwrap(fetchAndWait(denying, FetchRequest(url: url, retries: 2, retryBackoffMs: 1)))
            let error = try XCTUnwrap(outcome.error, "\(host) was fetched")
            XCTAssertEqual(error.kind, .connect, "\(host): \(error.message)")
            XCTAssertTrue(error.message.contains("is denied"), "\(host): \(error.message)")
            XCTAssertEqual(outcome.attempts, 1, host)
        }
        let stats = try upstream.stats()
        XCTAssertEqual(stats["connections"]?.intValue, 1, "only the /stats request's own")
        XCTAssertEqual(stats["requests"]?.intValue, 0)
        XCTAssertFalse(v6.acceptPending(), "a connection reached ::1")
    }

    func testDenialNamesWhatTheAddressReaches() throws {
        let loopback = [try AddressRange(cidr: "127.0.0.0/8")]
        func denial(_ text: String, _ ranges: [AddressRange]) throws -> String? {
            AddressRange.denial(of: try XCTUnwrap(AddressRange.parseAddress(text), text), by: ranges)
        }
        XCTAssertEqual(try denial("127.0.0.1", loopback), "address 127.0.0.1 is denied (127.0.0.0/8)")
        XCTAssertEqual(try denial("::ffff:127.0.0.9", loopback), "address ::ffff:127.0.0.9 is denied as 127.0.0.9 (127.0.0.0/8)")
        XCTAssertEqual(try denial("::127.0.0.9", loopback), "address ::127.0.0.9 is denied as 127.0.0.9 (127.0.0.0/8)")
        XCTAssertEqual(try denial("0.0.0.0", loopback), "address 0.0.0.0 reaches this host and is denied as 127.0.0.1 (127.0.0.0/8)")
        XCTAssertEqual(try denial("::", loopback), "address :: reaches this host and is denied as 127.0.0.1 (127.0.0.0/8)")
        XCTAssertEqual(try denial("::", [try AddressRange(cidr: "::1")]), "address :: reaches this host and is denied as ::1 (::1)")
        XCTAssertNil(try denial("::1", loopback), "::1 is IPv6 loopback, not 0.0.0.1")
        XCTAssertNil(try denial("0.0.0.0", [try AddressRange(cidr: "10.0.0.0/8")]))
        XCTAssertNil(try denial("::ffff:10.1.2.3", loopback))
        XCTAssertNil(try denial("2001:db8::1", loopback))
        // An IPv6 range written over mapped addresses holds their IPv4 form too.
        let mappedRange = [try AddressRange(cidr: "::ffff:0:0/96")]
        XCTAssertNotNil(try denial("::ffff:8.8.8.8", mappedRange))
        XCTAssertNil(try denial("1.2.3.4", []))
    }
}

/// Descriptors held open to exhaust the process's limit; closed by `closeAll`
/// from whichever thread gets there first.
private final class FillerDescriptors: @unchecked Sendable {
    // Safe to share: every access to `fds` holds `lock`.
    private let lock = NSLock()
    private var fds: [Int32] = []

    /// Duplicates stdin until `dup` fails with EMFILE, at most `limit` times.
    func fill(limit: Int) throws {
        lock.lock()
        defer { lock.unlock() }
        for _ in 0..<limit {
            let fd = dup(0)
            if fd < 0 {
                guard errno == EMFILE else { throw UpstreamError("dup failed with errno \(errno)") }
                return
            }
            fds.append(fd)
        }
        throw UpstreamError("no EMFILE after \(limit) descriptors")
    }

    func closeAll() {
        lock.lock()
        defer { lock.unlock() }
        for fd in fds { Glibc.close(fd) }
        fds.removeAll()
    }
}

/// A listening socket on [::1]:port that never answers: a connection to it
/// shows up as one waiting to be accepted.
private final class LoopbackV6Listener {
    private var fd: Int32

    init(port: Int) throws {
        fd = socket(AF_INET6, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw UpstreamError("socket(AF_INET6): errno \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in6()
        address.sin6_family = sa_family_t(AF_INET6)
        address.sin6_port = in_port_t(UInt16(port).bigEndian)
        address.sin6_addr = in6addr_loopback
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
        }
        guard bound == 0, listen(fd, 16) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw UpstreamError("cannot listen on [::1]:\(port): errno \(code)")
        }
    }

    /// Accepts (and closes) every waiting connection; true if there was one.
    func acceptPending() -> Bool {
        var any = false
        for _ in 0..<64 {
            let client = accept(fd, nil, nil)
            if client < 0 { break }
            Glibc.close(client)
            any = true
        }
        return any
    }

    func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }
}
