import Foundation

/// A throwaway CA and server certificates made with `openssl` by `Tests/Fixtures/make-tls.sh`, in a temporary
/// folder removed by `remove()`.
public final class TLSMaterial: @unchecked Sendable {
    // @unchecked: its one stored property is a constant (the files are removed by whoever made it, once).
    /// The folder holding the files.
    public let directory: String

    /// The CA certificate, for `--ca-file`.
    public var caFile: String { directory + "/ca.pem" }
    /// A server certificate for `127.0.0.1` and `localhost`, signed by the CA.
    public var server: (cert: String, key: String) { (directory + "/server.pem", directory + "/server.key") }
    /// A server certificate for `wrong.example` only, signed by the CA: a host name mismatch on 127.0.0.1.
    public var wrongName: (cert: String, key: String) { (directory + "/wrong.pem", directory + "/wrong.key") }

    /// Makes the files (a second or so).
    /// - Throws: `UpstreamError` when `openssl` or the script fails.
    public init() throws {
        directory = NSTemporaryDirectory() + "jobserver-tls-" + UUID().uuidString
        let script = URL(fileURLWithPath: Upstream.scriptPath).deletingLastPathComponent()
            .appendingPathComponent("make-tls.sh").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["bash", script, directory]
        do {
            try process.run()
        } catch {
            throw UpstreamError("cannot run \(script): \(error)")
        }
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw UpstreamError("\(script) exited \(process.terminationStatus)")
        }
    }

    /// Deletes the folder.
    public func remove() { try? FileManager.default.removeItem(atPath: directory) }
}
