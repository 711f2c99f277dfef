// FetchBench: fetches every URL of a list through one Fetcher, at most N at a
// time, and prints the wall time of the transfers in milliseconds
// (bench/20-fetch.sh). Foundation-free, so process start-up stays as small as curl's.
//
// Usage: FetchBench <url-list-file> <max-concurrency>
// FETCHBENCH_CA_FILE=PEM adds trusted roots, as --ca-file does (bench/70-transfer.sh).
import JobCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Writes `text` to standard error, unbuffered as `stderr` is: Swift 6 counts the C `stderr` global as shared
/// mutable state, so the descriptor is written directly.
func writeStandardError(_ text: String) {
    let bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let written = bytes[offset...].withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
        if written < 0 && errno == EINTR { continue }
        guard written > 0 else { return }
        offset += written
    }
}

func fail(_ message: String) -> Never {
    writeStandardError("FetchBench: \(message)\n")
    exit(1)
}

func readLines(_ path: String) -> [String] {
    guard let file = fopen(path, "r") else { fail("cannot open \(path)") }
    defer { fclose(file) }
    var lines: [String] = []
    var buffer: UnsafeMutablePointer<CChar>?
    var capacity = 0
    while getline(&buffer, &capacity, file) > 0, let buffer {
        let line = String(cString: buffer).trimmingLineEnd()
        if !line.isEmpty { lines.append(line) }
    }
    free(buffer)
    return lines
}

extension String {
    func trimmingLineEnd() -> String {
        var s = self[...]
        while let last = s.last, last == "\n" || last == "\r" || last == "\r\n" { s = s.dropLast() }
        return String(s)
    }
}

let arguments = CommandLine.arguments
guard arguments.count == 3, let concurrency = Int(arguments[2]), concurrency > 0 else {
    writeStandardError("usage: FetchBench <url-list-file> <max-concurrency>\n")
    exit(2)
}
let urls = readLines(arguments[1])

var configuration = FetcherConfiguration()
configuration.maxConcurrentFetches = concurrency
configuration.maxPerHost = concurrency
configuration.denyCIDRs = []
if let caFile = getenv("FETCHBENCH_CA_FILE") { configuration.caFile = String(cString: caFile) }
let fetcher: Fetcher
do {
    fetcher = try Fetcher(configuration: configuration)
} catch {
    fail("\(error)")
}

/// Hands out the next URL and counts outcomes; started from main, then from completions.
final class Window: @unchecked Sendable {
    // @unchecked: `next`, `completed` and `failures` change only with `mutex` held; `urls` and `fetcher` are never
    // changed; `failures` is read without it only after `wait()`, which the last completion's `sem_post` releases
    // once nothing changes it any more.
    private var mutex = pthread_mutex_t()
    private var next = 0
    private var completed = 0
    private(set) var failures = 0
    private var done = sem_t()
    let urls: [String]
    let fetcher: Fetcher

    init(urls: [String], fetcher: Fetcher) {
        self.urls = urls
        self.fetcher = fetcher
        pthread_mutex_init(&mutex, nil)
        sem_init(&done, 0, 0)
    }

    func startNext() {
        pthread_mutex_lock(&mutex)
        guard next < urls.count else {
            pthread_mutex_unlock(&mutex)
            return
        }
        let url = urls[next]
        next += 1
        pthread_mutex_unlock(&mutex)
        fetcher.start(FetchRequest(url: url)) { [self] outcome in
            pthread_mutex_lock(&mutex)
            completed += 1
            if case .failure(let error) = outcome.result {
                if failures == 0 { writeStandardError("FetchBench: \(error)\n") }
                failures += 1
            }
            let finished = completed == urls.count
            pthread_mutex_unlock(&mutex)
            if finished { sem_post(&done) } else { startNext() }
        }
    }

    func wait() { while sem_wait(&done) != 0 {} }
}

let window = Window(urls: urls, fetcher: fetcher)
var precise = timespec()
clock_gettime(CLOCK_MONOTONIC, &precise)
for _ in 0..<min(concurrency, urls.count) { window.startNext() }
if !urls.isEmpty { window.wait() }
var end = timespec()
clock_gettime(CLOCK_MONOTONIC, &end)
let wallMs = Double(end.tv_sec - precise.tv_sec) * 1000 + Double(end.tv_nsec - precise.tv_nsec) / 1_000_000
fetcher.shutdown()
if window.failures > 0 { fail("\(window.failures) of \(urls.count) fetches failed") }
print(Double(Int(wallMs * 10)) / 10)
