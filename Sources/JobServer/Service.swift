import Foundation
import HTTPServer
import JobCore

/// Why the service could not start: which step, and the underlying error.
struct StartupError: Error, CustomStringConvertible {
    var step: String
    var underlying: Error
    var description: String { "\(step): \(underlying)" }
}

/// The whole server wired together: store, fetcher, engine, routes and HTTP listener.
/// `main.swift` runs one; tests run one on port 0.
final class Service: @unchecked Sendable {
    // @unchecked: every stored property is an immutable reference to a type that is itself Sendable
    // (each proves it at its declaration).
    let config: ServerConfig
    let engine: Engine
    let fetcher: Fetcher
    let app: App
    let webhooks: WebhookOutbox
    private let server: HTTPServer
    private let logger: Logger

    /// The engine over `store`, its answers shown as `Presentation` says; not started.
    static func engine(store: JobStore, fetcher: Fetcher, config: ServerConfig, logger: Logger) -> Engine {
        let spool = config.answerSpool
        let rendering = AnswerRendering(
            settled: Presentation.jobBytes,
            settledWithResultText: { try Presentation.jobAnswer($0, result: $1, spool: spool) },
            settledAround: { try Presentation.jobAnswer($0, result: $1, spool: .inMemory) },
            nodeList: Presentation.nodeListBytes,
            nodeListWithResultText: { try Presentation.nodeListAnswer($0, spool: spool) })
        return Engine(
            store: store, fetcher: fetcher, configuration: config.engineConfiguration, logger: logger,
            rendering: rendering)
    }

    /// Creates the database folder, opens the store and the fetcher. Nothing runs yet.
    /// - Throws: `StartupError`.
    init(config: ServerConfig, logger: Logger) throws {
        self.config = config
        self.logger = logger
        let store: JobStore
        let outboxDatabase: @Sendable () throws -> WebhookOutboxDatabase
        if config.usesPostgres {
            let url = config.dbPath
            do {
                store = try PostgresJobStore(url: url, logger: logger, leaseTtlMs: config.leaseTtlMs)
            } catch {
                // libpq's reason never includes the password; the URL might.
                throw StartupError(step: "open the PostgreSQL store", underlying: error)
            }
            outboxDatabase = { try PostgresWebhookOutboxDatabase(url: url) }
        } else {
            let folder = URL(fileURLWithPath: config.dbPath).deletingLastPathComponent().path
            do {
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
                store = try SQLiteJobStore(path: config.dbPath, logger: logger)
            } catch {
                throw StartupError(step: "open the store at \(config.dbPath)", underlying: error)
            }
            let path = config.dbPath
            outboxDatabase = { try SQLiteWebhookOutboxDatabase(path: path) }
        }
        do {
            fetcher = try Fetcher(configuration: config.fetcherConfiguration)
        } catch {
            throw StartupError(step: "start the fetcher", underlying: error)
        }
        engine = Self.engine(store: store, fetcher: fetcher, config: config, logger: logger)
        let engine = self.engine
        webhooks = WebhookOutbox(
            database: outboxDatabase, store: store, fetcher: fetcher, configuration: config.webhookConfiguration,
            logger: logger, render: Presentation.webhookBytes, onChange: { engine.forgetSettledAnswer(jobID: $0) })
        let webhooks = self.webhooks
        engine.notifyStatus = { webhooks.status(jobID: $0) }
        do {
            // On PostgreSQL the cache is each server's own, in memory: it holds copies, not promises.
            engine.httpCache = try HTTPCache(path: config.usesPostgres ? nil : config.dbPath, capacityBytes: config.cacheBytes)
        } catch {
            throw StartupError(step: "open the HTTP cache", underlying: error)
        }
        app = App(engine: engine, fetcher: fetcher, config: config, logger: logger)
        app.webhooks = webhooks
        server = HTTPServer(configuration: app.makeServerConfiguration(), router: app.makeRouter())
    }

    /// Recovers unfinished jobs, then listens; logs `listening` and returns the bound port.
    /// - Throws: `StartupError`.
    func start() throws -> Int {
        do {
            try engine.start()
        } catch {
            throw StartupError(step: "start the engine", underlying: error)
        }
        do {
            try webhooks.start()
        } catch {
            engine.shutdown(gracePeriodMs: 0)
            fetcher.shutdown()
            throw StartupError(step: "open the webhook outbox", underlying: error)
        }
        let port: Int
        do {
            port = try server.start()
        } catch {
            webhooks.stop()
            engine.shutdown(gracePeriodMs: 0)
            fetcher.shutdown()
            throw StartupError(step: "listen on \(config.host):\(config.port)", underlying: error)
        }
        logger.info("listening", ["host": .string(config.host), "port": .int(port)])
        return port
    }

    /// The orderly stop of API.md §4: refuse new jobs and answer open long-polls at once,
    /// stop accepting, let responses in flight finish, then persist and close — all within
    /// `--shutdown-grace` as far as the parts allow. Blocks until done.
    func shutdown() {
        let deadline = Timestamp.monotonicMs() + Int64(config.shutdownGraceMs)
        app.beginShutdown()
        engine.beginShutdown()
        server.beginShutdown()
        if !server.shutdown(gracePeriodSeconds: Double(config.shutdownGraceMs) / 1000) {
            logger.warning("connections still open at the end of the grace period")
        }
        webhooks.stop()
        engine.shutdown(gracePeriodMs: Int(max(0, deadline - Timestamp.monotonicMs())))
        fetcher.shutdown()
        logger.info("stopped")
    }
}
