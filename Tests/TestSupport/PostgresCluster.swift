import Foundation

/// A throwaway PostgreSQL cluster (`scripts/pg-cluster.sh`) on a free loopback port, removed by `stop()`.
///
/// When PostgreSQL cannot start, `start()` throws with the script's reason: the tests that need it fail with
/// that reason rather than being skipped.
public final class PostgresCluster: @unchecked Sendable {
    // Immutable after init; `stop()` is called by one test class's tearDown.
    /// The `postgres://` URL of the cluster's `postgres` database.
    public let url: String
    private let directory: String

    private init(url: String, directory: String) {
        self.url = url
        self.directory = directory
    }

    static var scriptPath: String {
        let here = URL(fileURLWithPath: #filePath)
        return here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/pg-cluster.sh").path
    }

    /// initdb and start, without fsync (a crash of the test's PostgreSQL itself is not what is tested).
    public static func start() throws -> PostgresCluster {
        // Under /tmp, which the unprivileged user the cluster runs as (when the tests run as root) can enter.
        let directory = "/tmp/jobserver-pg-\(UUID().uuidString)"
        let (status, output, errors) = try run(["start", directory], environment: ["PG_FSYNC": "off"])
        guard status == 0, let url = output.split(separator: "\n").last.map(String.init), url.hasPrefix("postgres://") else {
            _ = try? run(["stop", directory])
            throw UpstreamError("PostgreSQL did not start: \(errors.isEmpty ? output : errors)")
        }
        return PostgresCluster(url: url, directory: directory)
    }

    /// The URL of another database in the cluster, created empty.
    public func freshDatabase() throws -> String {
        let name = "db_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        let (status, _, errors) = try Self.process("/usr/bin/env", ["psql", url, "-qAtc", "CREATE DATABASE \(name)"])
        guard status == 0 else { throw UpstreamError("CREATE DATABASE failed: \(errors)") }
        guard let slash = url.lastIndex(of: "/") else { throw UpstreamError("odd cluster URL \(url)") }
        return url[..<slash] + "/" + name
    }

    /// Stops the server at once and removes its files.
    public func stop() {
        _ = try? Self.run(["stop", directory])
    }

    private static func run(_ arguments: [String], environment: [String: String] = [:]) throws -> (Int32, String, String) {
        try process("/usr/bin/env", ["bash", scriptPath] + arguments, environment: environment)
    }

    private static func process(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:]
    ) throws -> (Int32, String, String) {
        // Output goes to files, not pipes: the PostgreSQL server started by the script would inherit a pipe's
        // write end and keep it open, so that reading it to the end would never finish.
        let base = NSTemporaryDirectory() + "pg-cluster-\(UUID().uuidString)"
        _ = FileManager.default.createFile(atPath: base + ".out", contents: nil)
        _ = FileManager.default.createFile(atPath: base + ".err", contents: nil)
        defer {
            try? FileManager.default.removeItem(atPath: base + ".out")
            try? FileManager.default.removeItem(atPath: base + ".err")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        process.standardOutput = FileHandle(forWritingAtPath: base + ".out")
        process.standardError = FileHandle(forWritingAtPath: base + ".err")
        try process.run()
        process.waitUntilExit()
        let output = readText(base + ".out")
        let errors = readText(base + ".err")
        return (
            process.terminationStatus,
            output.trimmingCharacters(in: .whitespacesAndNewlines),
            errors.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The text of a file a command wrote, "" when it is empty or unreadable. An empty file is not handed to
    /// Foundation: on Linux its reader of a file whose size is 0 (the path swift-foundation#739 added for /proc)
    /// allocates a 4 KiB buffer and, when nothing is read, returns an empty `Data` without freeing it.
    private static func readText(_ path: String) -> String {
        var info = stat()
        guard stat(path, &info) == 0, info.st_size > 0 else { return "" }
        return (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }
}
