import CCurl
import Foundation

/// The roots a TLS peer is verified against: the system's bundle plus the certificates of `--ca-file`.
///
/// libcurl's `CURLOPT_CAINFO` would replace the system bundle, while `--ca-file` adds to it (API.md §9): the two
/// are joined once, at start, into one PEM blob that every transfer points at.
final class TrustedRoots {
    /// The PEM bytes, alive as long as the fetcher that hands them to libcurl without a copy.
    let pem: UnsafeMutableRawBufferPointer

    /// Reads `caFile` and the system bundle libcurl was built with.
    /// - Throws: `FetcherError` when `caFile` cannot be read or holds no PEM certificate.
    init(caFile: String) throws {
        let extra = try TrustedRoots.certificates(in: caFile)
        var bytes: [UInt8] = []
        if let info = ccurl_version_info(), let path = info.pointee.cainfo,
            let system = FileManager.default.contents(atPath: String(cString: path))
        {
            bytes.append(contentsOf: system)
            bytes.append(10)
        }
        bytes.append(contentsOf: extra)
        pem = .allocate(byteCount: bytes.count, alignment: 1)
        pem.copyBytes(from: bytes)
    }

    deinit { pem.deallocate() }

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
