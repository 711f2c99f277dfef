import JobCore
import XCTest

@testable import JobServer

final class ServerConfigTests: XCTestCase {
    private func serve(_ args: [String], env: [String: String] = [:]) throws -> ServerConfig {
        guard case .serve(let config) = try CommandLineParser.parse(args, environment: env) else {
            XCTFail("expected serve")
            return ServerConfig()
        }
        return config
    }

    private func assertRefused(_ args: [String], env: [String: String] = [:], mentioning text: String,
                               file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try CommandLineParser.parse(args, environment: env), file: file, line: line) { error in
            let message = (error as? ConfigError)?.message ?? ""
            XCTAssertTrue(message.contains(text), "\(message) should mention \(text)", file: file, line: line)
        }
    }

    func testNoArgumentsServeWithAPIDefaults() throws {
        let config = try serve([])
        XCTAssertEqual(config, ServerConfig())
        XCTAssertEqual(config.host, "0.0.0.0")
        XCTAssertEqual(config.port, 8080)
        XCTAssertEqual(config.dbPath, "./data/jobserver.sqlite")
        XCTAssertNil(config.token)
        XCTAssertEqual(config.maxRequestBytes, 1 << 20)
        XCTAssertEqual(config.maxNodes, 10_000)
        XCTAssertEqual(config.maxDepth, 64)
        XCTAssertEqual(config.maxResponseBytes, 10 << 20)
        XCTAssertEqual(config.maxConcurrentFetches, 256)
        XCTAssertEqual(config.maxPerHost, 16)
        XCTAssertEqual(config.denyCIDRs, ["169.254.0.0/16"])
        XCTAssertEqual(config.retentionMs, 7 * 86_400_000)
        XCTAssertEqual(config.shutdownGraceMs, 10_000)
        XCTAssertEqual(config.requestTimeoutMs, 30_000)
        XCTAssertEqual(config.httpConfiguration.requestTimeoutSeconds, 30)
        XCTAssertEqual(config.maxActiveJobs, 10_000)
        XCTAssertEqual(config.maxActiveNodes, 20_000)
        XCTAssertEqual(config.logLevel, .info)
    }

    func testServeSubcommandIsTheDefault() throws {
        XCTAssertEqual(try serve(["serve", "--port", "9"]), try serve(["--port", "9"]))
    }

    func testHelpInAnyForm() throws {
        XCTAssertEqual(try CommandLineParser.parse(["--help"], environment: [:]), .help)
        XCTAssertEqual(try CommandLineParser.parse(["-h"], environment: [:]), .help)
        XCTAssertEqual(try CommandLineParser.parse(["serve", "--help"], environment: [:]), .help)
        XCTAssertEqual(try CommandLineParser.parse(["help"], environment: [:]), .help)
        XCTAssertTrue(CommandLineParser.usage.contains("--max-per-host"))
        XCTAssertTrue(CommandLineParser.usage.contains("JOBSERVER_MAX_PER_HOST"))
    }

    func testEveryFlagIsRead() throws {
        let config = try serve([
            "--host", "127.0.0.1", "--port=0", "--db", "/tmp/x/y.sqlite", "--token", "s3cret",
            "--max-request-bytes", "2MiB", "--max-nodes", "50", "--max-depth", "8", "--max-response-bytes", "512k",
            "--max-concurrent-fetches", "32", "--max-per-host", "4", "--deny-cidr", "10.0.0.0/8",
            "--retention", "12h", "--shutdown-grace", "3s", "--max-active-jobs", "7", "--log-level", "debug",
            "--request-timeout", "1500ms", "--max-active-nodes", "0",
        ])
        XCTAssertEqual(config.host, "127.0.0.1")
        XCTAssertEqual(config.port, 0)
        XCTAssertEqual(config.dbPath, "/tmp/x/y.sqlite")
        XCTAssertEqual(config.token, "s3cret")
        XCTAssertEqual(config.maxRequestBytes, 2 << 20)
        XCTAssertEqual(config.maxNodes, 50)
        XCTAssertEqual(config.maxDepth, 8)
        XCTAssertEqual(config.maxResponseBytes, 512 << 10)
        XCTAssertEqual(config.maxConcurrentFetches, 32)
        XCTAssertEqual(config.maxPerHost, 4)
        XCTAssertEqual(config.denyCIDRs, ["10.0.0.0/8"])
        XCTAssertEqual(config.retentionMs, 12 * 3_600_000)
        XCTAssertEqual(config.shutdownGraceMs, 3000)
        XCTAssertEqual(config.requestTimeoutMs, 1500)
        XCTAssertEqual(config.httpConfiguration.requestTimeoutSeconds, 1.5)
        XCTAssertEqual(config.maxActiveJobs, 7)
        XCTAssertEqual(config.maxActiveNodes, 0)
        XCTAssertEqual(config.logLevel, .debug)
    }

    func testEnvironmentVariablesAreRead() throws {
        let config = try serve([], env: [
            "JOBSERVER_PORT": "9090", "JOBSERVER_MAX_PER_HOST": "3", "JOBSERVER_TOKEN": "t",
            "JOBSERVER_DENY_CIDR": "10.0.0.0/8, 192.168.0.0/16", "JOBSERVER_RETENTION": "0",
            "JOBSERVER_MAX_REQUEST_BYTES": "4096", "JOBSERVER_REQUEST_TIMEOUT": "2m", "UNRELATED": "x",
        ])
        XCTAssertEqual(config.requestTimeoutMs, 120_000)
        XCTAssertEqual(config.port, 9090)
        XCTAssertEqual(config.maxPerHost, 3)
        XCTAssertEqual(config.token, "t")
        XCTAssertEqual(config.denyCIDRs, ["10.0.0.0/8", "192.168.0.0/16"])
        XCTAssertEqual(config.retentionMs, 0)
        XCTAssertEqual(config.maxRequestBytes, 4096)
    }

    func testFlagWinsOverEnvironment() throws {
        let config = try serve(["--port", "7000", "--deny-cidr", "127.0.0.0/8"],
                               env: ["JOBSERVER_PORT": "9090", "JOBSERVER_DENY_CIDR": "10.0.0.0/8"])
        XCTAssertEqual(config.port, 7000)
        XCTAssertEqual(config.denyCIDRs, ["127.0.0.0/8"])
    }

    func testDenyCIDRIsRepeatableAndCommaSeparated() throws {
        let config = try serve(["--deny-cidr", "10.0.0.0/8,172.16.0.0/12", "--deny-cidr", "fd00::/8"])
        XCTAssertEqual(config.denyCIDRs, ["10.0.0.0/8", "172.16.0.0/12", "fd00::/8"])
        XCTAssertEqual(try serve(["--deny-cidr", ""]).denyCIDRs, [])
    }

    func testSizesAcceptBytesAndBinarySuffixes() throws {
        XCTAssertEqual(try CommandLineParser.size("1048576", flag: "f"), 1 << 20)
        XCTAssertEqual(try CommandLineParser.size("64KiB", flag: "f"), 64 << 10)
        XCTAssertEqual(try CommandLineParser.size("64k", flag: "f"), 64 << 10)
        XCTAssertEqual(try CommandLineParser.size("10MiB", flag: "f"), 10 << 20)
        XCTAssertEqual(try CommandLineParser.size("10m", flag: "f"), 10 << 20)
        XCTAssertEqual(try CommandLineParser.size("1G", flag: "f"), 1 << 30)
        for bad in ["", "0", "-1", "1.5MiB", "MiB", "10 MB", "ten", "10KB", "99999999999999999999"] {
            XCTAssertThrowsError(try CommandLineParser.size(bad, flag: "f"), "\(bad)")
        }
    }

    func testDurationsAcceptUnitsAndZero() throws {
        XCTAssertEqual(try CommandLineParser.duration("7d", flag: "f"), 7 * 86_400_000)
        XCTAssertEqual(try CommandLineParser.duration("12h", flag: "f"), 12 * 3_600_000)
        XCTAssertEqual(try CommandLineParser.duration("30m", flag: "f"), 30 * 60_000)
        XCTAssertEqual(try CommandLineParser.duration("45s", flag: "f"), 45_000)
        XCTAssertEqual(try CommandLineParser.duration("250ms", flag: "f"), 250)
        XCTAssertEqual(try CommandLineParser.duration("0", flag: "f"), 0)
        for bad in ["", "7", "d", "-1s", "1.5h", "7w", "s7", "99999999999999999d"] {
            XCTAssertThrowsError(try CommandLineParser.duration(bad, flag: "f"), "\(bad)")
        }
    }

    func testAPostgresURLSelectsThePostgresStore() throws {
        let flag = try serve(["--db", "postgres://u@127.0.0.1/jobs"])
        XCTAssertTrue(flag.usesPostgres)
        XCTAssertEqual(flag.dbPath, "postgres://u@127.0.0.1/jobs")
        XCTAssertTrue(try serve([], env: ["JOBSERVER_DB": "postgresql://u@127.0.0.1/jobs"]).usesPostgres)
        XCTAssertFalse(try serve(["--db", "/tmp/postgres/jobs.sqlite"]).usesPostgres)
    }

    func testLeaseTtlDefaultsTo15sAndIsBounded() throws {
        XCTAssertEqual(try serve([]).leaseTtlMs, 15_000)
        XCTAssertEqual(try serve(["--lease-ttl", "2s"]).leaseTtlMs, 2_000)
        XCTAssertEqual(try serve([], env: ["JOBSERVER_LEASE_TTL": "1m"]).leaseTtlMs, 60_000)
        assertRefused(["--lease-ttl", "500ms"], mentioning: "--lease-ttl")
        assertRefused(["--lease-ttl", "2h"], mentioning: "--lease-ttl")
        assertRefused(["--lease-ttl", "soon"], mentioning: "--lease-ttl")
        XCTAssertTrue(CommandLineParser.usage.contains("--lease-ttl"))
    }

    func testMaxJobBytesDefaultsTo64MiBAndZeroMeansNone() throws {
        XCTAssertEqual(try serve([]).maxJobBytes, 64 << 20)
        XCTAssertEqual(try serve([]).engineConfiguration.maxJobBytes, 64 << 20)
        XCTAssertEqual(try serve(["--max-job-bytes", "1MiB"]).engineConfiguration.maxJobBytes, 1 << 20)
        XCTAssertEqual(try serve(["--max-job-bytes", "0"]).engineConfiguration.maxJobBytes, 0)
        XCTAssertEqual(try serve([], env: ["JOBSERVER_MAX_JOB_BYTES": "512k"]).maxJobBytes, 512 << 10)
        assertRefused(["--max-job-bytes", "lots"], mentioning: "--max-job-bytes")
        XCTAssertTrue(CommandLineParser.usage.contains("--max-job-bytes"))
        XCTAssertEqual(try serve([]).engineConfiguration.maxResponseMemory, 64 << 20)
        XCTAssertEqual(try serve(["--max-response-memory", "1GiB"]).engineConfiguration.maxResponseMemory, 1 << 30)
        XCTAssertEqual(try serve(["--max-response-memory", "0"]).engineConfiguration.maxResponseMemory, 0)
        XCTAssertEqual(try serve([], env: ["JOBSERVER_MAX_RESPONSE_MEMORY": "2MiB"]).maxResponseMemory, 2 << 20)
        assertRefused(["--max-response-memory", "lots"], mentioning: "--max-response-memory")
    }

    func testBadValuesAreRefusedNamingTheFlag() {
        assertRefused(["--port", "65536"], mentioning: "--port")
        assertRefused(["--port", "http"], mentioning: "--port")
        assertRefused(["--max-nodes", "0"], mentioning: "--max-nodes")
        assertRefused(["--max-depth", "-3"], mentioning: "--max-depth")
        assertRefused(["--request-timeout", "0"], mentioning: "--request-timeout")
        assertRefused(["--request-timeout", "30"], mentioning: "--request-timeout")
        assertRefused(["--max-per-host", "1e3"], mentioning: "--max-per-host")
        assertRefused(["--deny-cidr", "10.0.0.0/33"], mentioning: "--deny-cidr")
        assertRefused(["--deny-cidr", "example.com/8"], mentioning: "--deny-cidr")
        assertRefused(["--retention", "forever"], mentioning: "--retention")
        assertRefused(["--shutdown-grace", "10"], mentioning: "--shutdown-grace")
        assertRefused(["--log-level", "loud"], mentioning: "--log-level")
        assertRefused(["--max-request-bytes", "1TB"], mentioning: "--max-request-bytes")
    }

    func testBadEnvironmentValueNamesTheVariable() {
        assertRefused([], env: ["JOBSERVER_PORT": "x"], mentioning: "JOBSERVER_PORT")
    }

    func testUnknownFlagsAndCommandsAndMissingValuesAreRefused() {
        assertRefused(["--bogus"], mentioning: "--bogus")
        assertRefused(["--bogus=1"], mentioning: "--bogus")
        assertRefused(["run"], mentioning: "run")
        assertRefused(["--port"], mentioning: "needs a value")
    }

    func testDerivedConfigurationsCarryTheValues() throws {
        let config = try serve([
            "--max-nodes", "5", "--max-depth", "3", "--max-response-bytes", "1k", "--max-active-jobs", "2",
            "--retention", "1h", "--max-concurrent-fetches", "9", "--max-per-host", "2", "--deny-cidr", "10.0.0.0/8",
            "--host", "127.0.0.1", "--port", "0", "--max-request-bytes", "100",
        ])
        XCTAssertEqual(config.graphLimits.maxNodes, 5)
        XCTAssertEqual(config.graphLimits.maxDepth, 3)
        XCTAssertEqual(config.graphLimits.maxResponseBytes, 1024)
        XCTAssertEqual(config.engineConfiguration.maxActiveJobs, 2)
        XCTAssertEqual(config.engineConfiguration.maxActiveNodes, 20_000)
        XCTAssertEqual(config.engineConfiguration.retentionMs, 3_600_000)
        XCTAssertEqual(config.engineConfiguration.limits.maxNodes, 5)
        XCTAssertEqual(config.fetcherConfiguration.maxConcurrentFetches, 9)
        XCTAssertEqual(config.fetcherConfiguration.maxPerHost, 2)
        XCTAssertEqual(config.fetcherConfiguration.maxResponseBytes, 1024)
        XCTAssertEqual(config.fetcherConfiguration.denyCIDRs, ["10.0.0.0/8"])
        XCTAssertEqual(config.httpConfiguration.host, "127.0.0.1")
        XCTAssertEqual(config.httpConfiguration.port, 0)
        XCTAssertEqual(config.httpConfiguration.maxRequestBodyBytes, 100)
    }
}
