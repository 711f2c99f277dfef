import Synchronization

/// A count of response body bytes held in memory, with a limit, taken from by the fetcher's thread as the bytes
/// arrive. Two kinds exist, chained:
/// - a job's budget (`--max-job-bytes`): the decoded body bytes its fetches hold, over all of them (in flight and
///   settled, every attempt of a retry, every page of a paginated fetch);
/// - the server's (`--max-response-memory`), which every job's budget also draws on: the bytes all jobs in memory
///   hold together. A job's bytes go back to it when the job leaves memory (this object is released), so the
///   count follows what the process really holds.
///
/// The chunk that would take either count over its limit is refused, so the transfer it belongs to fails with
/// `too_large` and neither limit is ever passed. The bytes of an attempt the fetcher throws away (the crossing
/// one's, one cut by a transfer error, an answer its retry replaces) are given back, so that a fetch in flight
/// that fails does not use up what the others could take.
public final class ByteBudget: Sendable {
    /// Which limit a budget stands for: it names the flag in a refusal, and says whether one passes.
    public enum Scope: Sendable {
        /// One job's (`--max-job-bytes`): refused fetches are not retried, the job would cross it again.
        case job
        /// The server's (`--max-response-memory`): it frees as other jobs end, so a refused fetch is retried
        /// when it asks for retries.
        case server
    }

    /// The budget in bytes.
    public let limit: Int
    public let scope: Scope
    /// The server's budget this one also draws on (a job's), if any.
    public let shared: ByteBudget?
    private let used: Atomic<Int>

    /// - Parameters:
    ///   - used: bytes already held when the job starts (a restarted job's stored results); the shared budget
    ///     counts them too, over its limit if need be, since they are in memory already.
    ///   - shared: the server's budget, which every byte taken here is taken from as well.
    public init(limit: Int, scope: Scope = .job, used: Int = 0, shared: ByteBudget? = nil) {
        self.limit = max(0, limit)
        self.scope = scope
        self.shared = shared
        self.used = Atomic(max(0, used))
        shared?.used.add(max(0, used), ordering: .relaxed)
    }

    deinit {
        // The job's results leave memory with it.
        shared?.giveBack(used.load(ordering: .relaxed))
    }

    /// Bytes counted so far.
    public var usedBytes: Int { used.load(ordering: .relaxed) }

    /// Bytes left before this budget or the one it draws on is crossed.
    public var remaining: Int { min(max(0, limit - usedBytes), shared?.remaining ?? .max) }

    /// Counts `count` more bytes here and in `shared`; when one of them cannot take them, nothing is counted and
    /// the answer is that budget.
    public func refusal(taking count: Int) -> ByteBudget? {
        guard count > 0 else { return nil }
        guard takeOwn(count) else { return self }
        if let shared, let refused = shared.refusal(taking: count) {
            used.subtract(count, ordering: .relaxed)
            return refused
        }
        return nil
    }

    /// The budget a declared body of `length` bytes would cross, if any (nothing is counted).
    public func refusal(declared length: Int) -> ByteBudget? {
        if length > max(0, limit - usedBytes) { return self }
        return shared?.refusal(declared: length)
    }

    private func takeOwn(_ count: Int) -> Bool {
        var current = used.load(ordering: .relaxed)
        while true {
            let (next, overflow) = current.addingReportingOverflow(count)
            if overflow || next > limit { return false }
            let (exchanged, original) = used.compareExchange(
                expected: current, desired: next, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    /// Gives back `count` bytes taken for a body that is no longer kept.
    public func giveBack(_ count: Int) {
        guard count > 0 else { return }
        used.subtract(count, ordering: .relaxed)
        shared?.giveBack(count)
    }

    /// The words of a `too_large` failure for the fetch that crossed this budget (the flag named, so an operator
    /// knows what to raise).
    public var exceeded: String {
        switch scope {
        case .job:
            "the job's responses together exceed its budget of \(limit) bytes (--max-job-bytes; \(usedBytes) bytes held when it was crossed)"
        case .server:
            "the responses of all jobs in memory together exceed the server's \(limit) bytes (--max-response-memory; \(usedBytes) bytes held when it was crossed)"
        }
    }
}
