import Dispatch
import Foundation
import HTTPServer
import JobCore

#if canImport(Glibc)
import Glibc
#endif

/// Writes `text` to standard error (stdout stays silent apart from `--help`).
func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

let command: Command
do {
    command = try CommandLineParser.parse(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
} catch {
    printError("jobserver: \(error)")
    exit(2)
}

guard case .serve(let config) = command else {
    print(CommandLineParser.usage, terminator: "")
    exit(0)
}

let logger = Logger(label: "jobserver", minimumLevel: config.logLevel)

/// Opens everything, or says why not and exits 1.
func startOrExit<T>(_ what: String, _ body: () throws -> T) -> T {
    do {
        return try body()
    } catch {
        logger.error("startup failed", ["step": .string(what), "error": .string("\(error)")])
        exit(1)
    }
}

let dbFolder = URL(fileURLWithPath: config.dbPath).deletingLastPathComponent().path
startOrExit("create the database folder \(dbFolder)") {
    try FileManager.default.createDirectory(atPath: dbFolder, withIntermediateDirectories: true)
}
let store = startOrExit("open the store at \(config.dbPath)") {
    try SQLiteJobStore(path: config.dbPath, logger: logger)
}
let fetcher = startOrExit("start the fetcher") { try Fetcher(configuration: config.fetcherConfiguration) }
let engine = Engine(store: store, fetcher: fetcher, configuration: config.engineConfiguration, logger: logger)
startOrExit("start the engine") { try engine.start() }

let app = App(engine: engine, fetcher: fetcher, config: config, logger: logger)
let server = HTTPServer(configuration: app.makeServerConfiguration(), router: app.makeRouter())
let port = startOrExit("listen on \(config.host):\(config.port)") { try server.start() }
logger.info("listening", ["host": .string(config.host), "port": .int(port)])

// The default actions would kill the process mid-write; a dispatch source turns the
// signals into an orderly shutdown instead.
signal(SIGTERM, SIG_IGN)
signal(SIGINT, SIG_IGN)
// Serial, and shutDown ends in exit(0): a second signal never starts a second shutdown.
let signalQueue = DispatchQueue(label: "jobserver.signals")

/// Stops accepting, drains, persists, exits 0 — within `--shutdown-grace` where the parts allow.
func shutDown(signalName: String) {
    let deadline = Timestamp.monotonicMs() + Int64(config.shutdownGraceMs)
    logger.info("shutting down", ["signal": .string(signalName), "grace_ms": .int(config.shutdownGraceMs)])
    app.beginShutdown()
    engine.beginShutdown()
    server.beginShutdown()
    let drained = server.shutdown(gracePeriodSeconds: Double(config.shutdownGraceMs) / 1000)
    if !drained { logger.warning("connections still open at the end of the grace period") }
    engine.shutdown(gracePeriodMs: Int(max(0, deadline - Timestamp.monotonicMs())))
    fetcher.shutdown()
    logger.info("stopped")
    exit(0)
}

var signalSources: [DispatchSourceSignal] = []
for (number, name) in [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT")] {
    let source = DispatchSource.makeSignalSource(signal: number, queue: signalQueue)
    source.setEventHandler { shutDown(signalName: name) }
    source.resume()
    signalSources.append(source)
}

dispatchMain()
