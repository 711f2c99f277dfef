// Times parse + validate (`JSONValue.parse` then `JobSpec.parse`) of job bodies of each shape at 1×, 10× and
// 100× a base size, and prints a markdown table of time per input byte: if the cost is linear, the three rows
// of a shape show about the same ns/byte. Also prints the issue-9 targets with their measured figures.
//
// Usage: ParseBench [runs [shape]]   (runs: default 5, median and min–max are over them; shape: only the shapes
// whose name contains it, and no targets table)
import Foundation
import JobCore

let runs = CommandLine.arguments.count > 1 ? max(1, Int(CommandLine.arguments[1]) ?? 5) : 5
let only = CommandLine.arguments.count > 2 ? CommandLine.arguments[2] : nil

/// One body to time, and the limits the server would hold it to.
struct Case {
    var shape: String
    var scale: Int
    var size: String
    var body: [UInt8]
    var limits: Limits
    /// True when the body must be refused (422), false when it must be accepted.
    var refused: Bool
}

let fetch = #"{"type":"fetch","url":"http://127.0.0.1:8080/items/1"}"#

func list(_ n: Int, child: String = fetch) -> String {
    #"{"graph":{"type":"list","children":["# + Array(repeating: child, count: n).joined(separator: ",") + "]}}"
}

func wideMetadata(_ keys: Int) -> String {
    var text = #"{"graph":\#(fetch),"metadata":{"#
    for i in 0..<keys {
        if i > 0 { text += "," }
        text += #""key\#(i)":\#(i)"#
    }
    return text + "}}"
}

/// A chain of `depth` nodes: sequences, each with one child, around a fetch.
func chain(_ depth: Int) -> String {
    #"{"graph":"# + String(repeating: #"{"type":"sequence","children":["#, count: depth - 1) + fetch
        + String(repeating: "]}", count: depth - 1) + "}"
}

func longString(_ bytes: Int) -> String {
    #"{"graph":{"type":"fetch","method":"POST","url":"http://127.0.0.1:8080/","body":""#
        + String(repeating: "abcdefghijklmnop", count: bytes / 16) + #""}}"#
}

func numbers(_ n: Int) -> String {
    #"{"graph":{"type":"fetch","method":"POST","url":"http://127.0.0.1:8080/","json":["#
        + (0..<n).map { "\($0).25e-1" }.joined(separator: ",") + "]}}"
}

func invalid(_ n: Int) -> String {
    list(n, child: #"{"type":"fetch","url":"ftp://127.0.0.1/items/1","retries":99}"#)
}

func sizeText(_ n: Int, _ unit: String) -> String { "\(n.formatted()) \(unit)" }

let scales = [1, 10, 100]
var cases: [Case] = []
for scale in scales {
    let wide = 400 * scale
    cases.append(Case(shape: "wide object (`metadata` keys, refused > 16 KiB)", scale: scale, size: sizeText(wide, "keys"),
                      body: Array(wideMetadata(wide).utf8), limits: Limits(), refused: scale > 1))
    let nodes = 500 * scale
    cases.append(Case(shape: "list of fetches", scale: scale, size: sizeText(nodes + 1, "nodes"),
                      body: Array(list(nodes).utf8), limits: Limits(maxNodes: Limits.maxNodesCeiling), refused: false))
    let depth = 30 * scale
    cases.append(Case(shape: "deep chain, at `--max-depth`", scale: scale, size: sizeText(depth, "levels"),
                      body: Array(chain(depth).utf8), limits: Limits(maxDepth: depth), refused: false))
    let bytes = 10_240 * scale
    cases.append(Case(shape: "long string (`body`)", scale: scale, size: sizeText(bytes, "bytes"),
                      body: Array(longString(bytes).utf8), limits: Limits(), refused: false))
    let count = 1_000 * scale
    cases.append(Case(shape: "many numbers (`json` array)", scale: scale, size: sizeText(count, "numbers"),
                      body: Array(numbers(count).utf8), limits: Limits(), refused: false))
    let bad = 180 * scale
    cases.append(Case(shape: "invalid list (every node refused)", scale: scale, size: sizeText(bad + 1, "nodes"),
                      body: Array(invalid(bad).utf8), limits: Limits(maxNodes: Limits.maxNodesCeiling), refused: true))
}

/// Parses and validates once; seconds taken. Exits if the outcome is not the expected one.
func timeOnce(_ c: Case) -> Double {
    let clock = ContinuousClock()
    var accepted = false
    let elapsed = clock.measure {
        do {
            let value = try JSONValue.parse(c.body, maxDepth: c.limits.requestJSONDepth)
            _ = try JobSpec.parse(value, limits: c.limits)
            accepted = true
        } catch {
            accepted = false
        }
    }
    if accepted == c.refused {
        FileHandle.standardError.write(Data("\(c.shape) \(c.size): expected \(c.refused ? "refusal" : "acceptance")\n".utf8))
        exit(1)
    }
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

struct Figures {
    var median: Double
    var min: Double
    var max: Double
}

func measure(_ c: Case) -> Figures {
    _ = timeOnce(c)  // warm-up: first-touch page faults are not the parser's
    let times = (0..<runs).map { _ in timeOnce(c) }.sorted()
    return Figures(median: times[times.count / 2], min: times.first ?? 0, max: times.last ?? 0)
}

func ms(_ s: Double) -> String { String(format: "%.2f", s * 1000) }
func nsPerByte(_ s: Double, _ bytes: Int) -> String { String(format: "%.1f", s * 1e9 / Double(bytes)) }

print("| shape | scale | size | body bytes | median ms (min–max) | ns/byte median (min–max) |")
print("|---|---:|---:|---:|---:|---:|")
for c in cases.sorted(by: { ($0.shape, $0.scale) < ($1.shape, $1.scale) }) where only.map(c.shape.contains) ?? true {
    let f = measure(c)
    let n = c.body.count
    print("| \(c.shape) | \(c.scale)× | \(c.size) | \(n.formatted()) | \(ms(f.median)) (\(ms(f.min))–\(ms(f.max))) "
        + "| \(nsPerByte(f.median, n)) (\(nsPerByte(f.min, n))–\(nsPerByte(f.max, n))) |")
}

if only != nil { exit(0) }

// The figures issue 9 sets, each on the body it describes.
let targets: [(String, Case, Double)] = [
    ("`metadata` with 40,000 keys, refused", Case(shape: "", scale: 0, size: "", body: Array(wideMetadata(40_000).utf8),
                                               limits: Limits(), refused: true), 0.050),
    ("list of 10,000 fetches, accepted", Case(shape: "", scale: 0, size: "", body: Array(list(9_999).utf8),
                                              limits: Limits(maxNodes: 10_000), refused: false), 0.150),
    ("list of 50,000 fetches, accepted", Case(shape: "", scale: 0, size: "", body: Array(list(49_999).utf8),
                                              limits: Limits(maxNodes: 50_000), refused: false), 1.0),
    ("invalid list of 18,000 nodes, refused", Case(shape: "", scale: 0, size: "", body: Array(invalid(17_999).utf8),
                                                   limits: Limits(maxNodes: 20_000), refused: true), 0.050),
]
print()
print("| body | bytes | median ms (min–max) | target |")
print("|---|---:|---:|---:|")
var missed = 0
for (name, c, target) in targets {
    let f = measure(c)
    if f.median > target { missed += 1 }
    print("| \(name) | \(c.body.count.formatted()) | \(ms(f.median)) (\(ms(f.min))–\(ms(f.max))) "
        + "| ≤ \(ms(target)) \(f.median <= target ? "met" : "MISSED") |")
}
exit(missed == 0 ? 0 : 3)
