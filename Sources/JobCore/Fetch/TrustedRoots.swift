import CCurl
import Foundation

/// The roots a TLS peer is verified against: the system's plus the certificates of `--ca-file`.
///
/// libcurl's `CURLOPT_CAINFO` alone would replace the system's roots, while `--ca-file` adds to them (API.md §9).
/// Where libcurl has a CA directory (`capath`, `/etc/ssl/certs` on Debian), the file goes in `CAINFO` and the
/// directory stays in `CAPATH`: OpenSSL looks certificates up in the directory by hash, and libcurl caches the
/// store it builds from the file across connections. Without a directory, the system bundle and the file are
/// joined once into one PEM blob that every transfer points at — correct, but parsed at each new connection.
final class TrustedRoots {
    /// The `--ca-file` path.
    let caFile: String
    /// libcurl's CA directory, kept beside `caFile`.
    let systemDirectory: String?
    /// The system bundle and `caFile` joined, when there is no directory; alive as long as the fetcher that hands
    /// it to libcurl without a copy.
    let pem: UnsafeMutableRawBufferPointer?

    /// Reads `caFile` and finds the system's roots libcurl was built with.
    /// - Throws: `FetcherError` when `caFile` cannot be read or holds no PEM certificate.
    init(caFile: String) throws {
        let extra = try TrustedRoots.certificates(in: caFile)
        self.caFile = caFile
        let info = ccurl_version_info()
        if let directory = info?.pointee.capath {
            systemDirectory = String(cString: directory)
            pem = nil
            return
        }
        systemDirectory = nil
        var bytes: [UInt8] = []
        if let path = info?.pointee.cainfo, let system = FileManager.default.contents(atPath: String(cString: path)) {
            bytes.append(contentsOf: system)
            bytes.append(10)
        }
        bytes.append(contentsOf: extra)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 1)
        buffer.copyBytes(from: bytes)
        pem = buffer
    }

    deinit { pem?.deallocate() }

    /// The bytes of a PEM file that holds at least one certificate.
    /// - Throws: `FetcherError` naming the file and what is wrong with it.
    static func certificates(in path: String) throws -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw FetcherError("--ca-file: cannot read \"\(path)\"")
        }
        let text = String(decoding: data, as: UTF8.self)
        guard text.contains("-----BEGIN CERTIFICATE-----") else {
            throw FetcherError("--ca-file: \"\(path)\" holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        return Array(data)
    }
}

extension FetcherConfiguration {
    /// Checks a `--ca-file` before anything starts.
    /// - Throws: `FetcherError` when the file cannot be read or holds no PEM certificate.
    public static func checkCAFile(_ path: String) throws {
        _ = try TrustedRoots.certificates(in: path)
    }
}
