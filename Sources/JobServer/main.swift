import Dispatch
import Foundation
import JobCore

#if canImport(Glibc)
import Glibc
#endif

// `jobserver submit|get|jobs|cancel|watch …`: the command-line client; everything else is the server's as before.
if let first = CommandLine.arguments.dropFirst().first, ClientCommand.names.contains(first) {
    exit(ClientCommand.main(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment))
}

let command: Command
do {
    command = try CommandLineParser.parse(
        Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
} catch {
    FileHandle.standardError.write(Data("jobserver: \(error)\n".utf8))
    exit(2)
}

guard case .serve(let config) = command else {
    print(CommandLineParser.usage, terminator: "")
    print("\nClient commands (jobserver COMMAND --help): submit, get, jobs, cancel, watch")
    exit(0)
}

MemoryTuning.apply()
let logger = Logger(label: "jobserver", minimumLevel: config.logLevel)
let service: Service
do {
    service = try Service(config: config, logger: logger)
    _ = try service.start()
} catch {
    logger.error("startup failed", ["error": .string("\(error)")])
    exit(1)
}

// The default actions would kill the process mid-write; a dispatch source turns the
// signals into an orderly shutdown instead. The queue is serial and the handler ends
// in exit(0), so a second signal never starts a second shutdown.
signal(SIGTERM, SIG_IGN)
signal(SIGINT, SIG_IGN)
let signalQueue = DispatchQueue(label: "jobserver.signals")
var signalSources: [DispatchSourceSignal] = []
for (number, name) in [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT")] {
    let source = DispatchSource.makeSignalSource(signal: number, queue: signalQueue)
    // @Sendable: runs on `signalQueue`, not on the main actor that Swift 6 gives a closure made in top-level code
    // (which would trap at run time); it takes what it uses with it.
    source.setEventHandler { @Sendable [logger, service, config] in
        logger.info("shutting down", ["signal": .string(name), "grace_ms": .int(config.shutdownGraceMs)])
        service.shutdown()
        exit(0)
    }
    source.resume()
    signalSources.append(source)
}

// The main thread parks here until the handler's exit(0). Not dispatchMain(): it ends the main thread with
// pthread_exit, which skips AddressSanitizer's cleanup of this frame, and libdispatch then runs its signal
// handling on that stack, still marked as this frame's redzones (a false stack-buffer-overflow in
// _dispatch_sigmask under `make test-sanitize`). Nothing here uses the main queue, and libdispatch's handler
// passes a signal that reaches this thread on to the sources.
while true { pause() }
