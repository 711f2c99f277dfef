import Glibc
import HTTPServer

// A fixed-route server for bench/10-http.sh: GET /bench/json (300 bytes of JSON) and GET /healthz.
// Usage: HTTPBenchServer [port]. SIGTERM/SIGINT shut it down gracefully (exit 0).

let port = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 8080 : 8080

/// Exactly 300 bytes of JSON, the same bytes nginx serves in the benchmark.
let benchBody: [UInt8] = {
    let head = #"{"id":"01JEXAMPLE7K3M2Q9R8T6V5W4X","state":"succeeded","progress":{"total":3,"done":3,"percent":100.0},"padding":""#
    let tail = #""}"#
    let fill = 300 - head.utf8.count - tail.utf8.count
    return Array((head + String(repeating: "x", count: max(0, fill)) + tail).utf8)
}()

let jsonHeaders = HTTPHeaders([("Content-Type", "application/json")])
let benchResponse = HTTPResponse(status: 200, headers: jsonHeaders, body: benchBody)
let healthResponse = HTTPResponse(status: 200, headers: jsonHeaders, body: Array(#"{"status":"ok"}"#.utf8))

/// Writes `text` to `fd` at once, unbuffered (what `print` and `fflush(stdout)` did): Swift 6 counts the C `stdout`
/// and `stderr` globals as shared mutable state.
func writeAll(_ fd: Int32, _ text: String) {
    let bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if written < 0 && errno == EINTR { continue }
        guard written > 0 else { return }
        offset += written
    }
}

let router = Router()
router.add("GET", "/bench/json") { _, responder in responder.send(benchResponse) }
router.add("GET", "/healthz") { _, responder in responder.send(healthResponse) }

// Block the signals before the loop threads start so that only sigwait below receives them.
var signals = sigset_t()
sigemptyset(&signals)
sigaddset(&signals, SIGTERM)
sigaddset(&signals, SIGINT)
pthread_sigmask(SIG_BLOCK, &signals, nil)

var configuration = HTTPServerConfiguration()
configuration.host = "127.0.0.1"
configuration.port = port
let server = HTTPServer(configuration: configuration, router: router)
do {
    let bound = try server.start()
    writeAll(STDOUT_FILENO, "HTTPBenchServer listening on 127.0.0.1:\(bound)\n")
} catch {
    writeAll(STDERR_FILENO, "HTTPBenchServer: \(error)\n")
    exit(1)
}
var received: Int32 = 0
sigwait(&signals, &received)
let drained = server.shutdown(gracePeriodSeconds: 5)
writeAll(STDERR_FILENO, "HTTPBenchServer: stopped (\(drained ? "drained" : "grace period passed"))\n")
exit(0)
