// STAND-IN for the agreed JobCore APIs (JobGraph validator, Fetcher, Store, Engine types).
// Dropped at merge; the real ones live in module JobCore.
import Foundation
import JobCore

/// Stand-in: per-job limits.
public struct GraphLimits {
    public var maxNodes = 10_000
    public var maxDepth = 64
    public var maxResponseBytes = 10 << 20
    public init() {}
}

/// Stand-in: one validation problem.
public struct ValidationIssue {
    public var pointer: String
    public var message: String
}

/// Stand-in: every validation problem of a job.
public struct ValidationError: Error {
    public var issues: [ValidationIssue]
}

/// Stand-in graph: the nodes in tree order (only what the stand-in engine needs).
public struct JobGraph {
    struct Node {
        var id: String
        var parent: String?
        var type: String
        var url: String?
    }
    var nodes: [Node]
}

/// Stand-in: a validated job.
public struct JobSpec {
    public var name: String?
    public var deadlineMs: Int?
    public var metadata: JSONValue?
    public var graph: JobGraph

    /// A small subset of the real validator: types, urls, children, node count and depth.
    public static func parse(_ body: JSONValue, limits: GraphLimits) throws -> JobSpec {
        guard case .object = body else {
            throw ValidationError(issues: [ValidationIssue(pointer: "", message: "a job must be a JSON object")])
        }
        var issues: [ValidationIssue] = []
        var nodes: [JobGraph.Node] = []
        var name: String?
        if let value = body["name"] {
            if let s = value.stringValue { name = s } else {
                issues.append(ValidationIssue(pointer: "/name", message: "must be a string"))
            }
        }
        func walk(_ node: JSONValue, pointer: String, path: String, parent: String?, depth: Int) {
            guard depth <= limits.maxDepth else {
                issues.append(ValidationIssue(pointer: pointer, message: "graph deeper than \(limits.maxDepth)"))
                return
            }
            guard case .object = node else {
                issues.append(ValidationIssue(pointer: pointer, message: "a node must be an object"))
                return
            }
            let id = node["id"]?.stringValue ?? path
            let type = node["type"]?.stringValue ?? ""
            switch type {
            case "fetch":
                let url = node["url"]?.stringValue ?? ""
                if !(url.hasPrefix("http://") || url.hasPrefix("https://")) {
                    issues.append(ValidationIssue(pointer: pointer + "/url", message: "scheme must be http or https"))
                }
                nodes.append(JobGraph.Node(id: id, parent: parent, type: type, url: url))
            case "list", "sequence":
                nodes.append(JobGraph.Node(id: id, parent: parent, type: type, url: nil))
                guard let children = node["children"]?.arrayValue, !children.isEmpty else {
                    issues.append(ValidationIssue(pointer: pointer + "/children", message: "must be a non-empty array"))
                    return
                }
                for (i, child) in children.enumerated() {
                    walk(child, pointer: "\(pointer)/children/\(i)", path: "\(path).\(i)", parent: id, depth: depth + 1)
                }
            default:
                issues.append(ValidationIssue(pointer: pointer + "/type", message: "must be fetch, list or sequence"))
            }
        }
        if let graph = body["graph"] {
            walk(graph, pointer: "/graph", path: "root", parent: nil, depth: 1)
        } else {
            issues.append(ValidationIssue(pointer: "/graph", message: "is required"))
        }
        if nodes.count > limits.maxNodes {
            issues.append(ValidationIssue(pointer: "/graph", message: "more than \(limits.maxNodes) nodes"))
        }
        guard issues.isEmpty else { throw ValidationError(issues: issues) }
        return JobSpec(name: name, deadlineMs: body["deadline_ms"]?.intValue, metadata: body["metadata"], graph: JobGraph(nodes: nodes))
    }
}

/// Stand-in: fetcher settings.
public struct FetcherConfiguration {
    public var maxConcurrentFetches = 256
    public var maxPerHost = 16
    public var maxResponseBytes = 10 << 20
    public var denyCIDRs = ["169.254.0.0/16"]
    public var connectTimeoutMs = 10_000
    public var proxy: String?
    public var userAgent = "jobserver/1"
    public init() {}
}

/// Stand-in: fetch statistics.
public struct FetcherStats {
    public var outcomes: [String: Int] = [:]
    public var latencyBucketsMs: [Double] = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
    public var latencyCounts: [Int] = Array(repeating: 0, count: 12)
    public var latencySumMs: Double = 0
    public var latencyCount: Int = 0
    public init() {}
}

/// Stand-in: the libcurl fetcher (does nothing here).
public final class Fetcher {
    public let configuration: FetcherConfiguration
    public init(configuration: FetcherConfiguration) throws { self.configuration = configuration }
    public var inFlight: Int { 0 }
    public var stats: FetcherStats { FetcherStats() }
    public func shutdown() {}
}

/// Stand-in: the store protocol.
public protocol JobStore: AnyObject, Sendable {}

/// Stand-in: the SQLite store (keeps nothing).
public final class SQLiteJobStore: JobStore, @unchecked Sendable {
    public init(path: String, logger: Logger) throws {}
}

/// Stand-in: a store failure.
public struct StoreError: Error, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}

/// Stand-in: something that can be called off.
public protocol Cancellable: AnyObject {
    func cancel()
}

/// Stand-in: engine settings.
public struct EngineConfiguration {
    public var limits = GraphLimits()
    public var maxActiveJobs = 10_000
    public var retentionMs: Int64 = 7 * 86_400_000
    public init() {}
}

/// Stand-in: what `submit` did.
public enum SubmitOutcome {
    case created(JobRecord), existing(JobRecord), conflict(JobRecord), queueFull, shuttingDown
}

/// Stand-in: what `cancel` did.
public enum CancelOutcome {
    case cancelling(JobRecord), alreadyCancelled(JobRecord), alreadySettled(JobRecord), notFound
}

/// Stand-in: what `delete` did.
public enum DeleteOutcome {
    case deleted, active(JobRecord), notFound
}

/// Stand-in: engine gauges.
public struct EngineMetrics {
    public var jobsByState: [NodeState: Int]
    public var nodesByState: [NodeState: Int]
    public var activeJobs: Int
    public var pendingFetches: Int
    public var fetchesInFlight: Int
}

/// Stand-in: one page of jobs.
public struct JobPage {
    public var jobs: [JobRecord]
    public var nextCursor: String?
}
