import Synchronization

/// A job's response byte budget (`--max-job-bytes`): the decoded response body bytes its fetches hold, over all of
/// them (in flight and settled, every attempt of a retry, every page of a paginated fetch), counted by the
/// fetcher's thread as they arrive. The chunk that would take the count over `limit` is refused, so the transfer
/// it belongs to fails with `too_large` and the job never holds more response bytes than its budget. The bytes of
/// an attempt the fetcher throws away (the crossing one's, one cut by a transfer error, an answer its retry
/// replaces) are given back, so that a fetch in flight that fails does not use up what the others could take.
public final class ByteBudget: Sendable {
    /// The budget in bytes.
    public let limit: Int
    private let used: Atomic<Int>

    /// - Parameter used: bytes already held when the job starts (a restarted job's stored results).
    public init(limit: Int, used: Int = 0) {
        self.limit = max(0, limit)
        self.used = Atomic(max(0, used))
    }

    /// Bytes counted so far.
    public var usedBytes: Int { used.load(ordering: .relaxed) }

    /// Bytes left before the budget is crossed.
    public var remaining: Int { max(0, limit - usedBytes) }

    /// Counts `count` more bytes; false, and nothing counted, when they would take the total over `limit`.
    public func take(_ count: Int) -> Bool {
        guard count > 0 else { return true }
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
    }

    /// The words of a `too_large` failure for the fetch that crossed the budget (the flag named, so an operator
    /// knows what to raise).
    public var exceeded: String {
        "the job's responses together exceed its budget of \(limit) bytes (--max-job-bytes; \(usedBytes) bytes held when it was crossed)"
    }

    /// Whether `error` is the failure of a fetch that crossed a job's budget, not its own `max_bytes`.
    public static func isBudgetFailure(_ error: NodeError) -> Bool {
        error.kind == .tooLarge && error.message.contains("(--max-job-bytes;")
    }
}
