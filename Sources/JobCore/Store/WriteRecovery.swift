/// What a store's writer keeps beside its pending changes, whatever its database: the commits and flushes it has yet
/// to answer, the changes it gave up, and, while writes fail for lack of a resource (*degraded*), the failure and when
/// to try again, the delay doubling from `firstRetryMs` up to `maxRetryMs` until a commit leaves nothing pending.
/// `StoreWriter` (SQLite) and `PostgresStoreWriter` each own one, used on their writer's thread alone.
struct WriteRecovery {
    static let firstRetryMs: Int64 = 50
    static let maxRetryMs: Int64 = 5000

    /// The failure, while degraded.
    private(set) var failure: StoreError?
    private var retryDelayMs: Int64 = 0
    private var retryAtMs: Int64 = 0
    /// `.committed` ops, answered once a commit leaves nothing pending.
    private var commitWaiters: [WriteTicket<Void>] = []
    /// Changes given up (a failure other than a resource), reported by the next flush.
    private var droppedFailure: StoreError?

    /// While degraded, how long (ms) until the next try; `nil` when not degraded.
    var retryWaitMs: Int64? { failure == nil ? nil : max(0, retryAtMs - Timestamp.monotonicMs()) }

    /// The failure, while degraded and it is not yet time to try again: ops are then refused at once rather than each
    /// one waiting on a failing disk.
    var failureBeforeRetry: StoreError? {
        guard let failure, Timestamp.monotonicMs() < retryAtMs else { return nil }
        return failure
    }

    mutating func awaitCommit(_ ticket: WriteTicket<Void>) { commitWaiters.append(ticket) }

    /// A write failed for lack of a resource: degraded, or still, with the next try after the (doubled) delay.
    mutating func degrade(_ error: StoreError, records: Int, logger: Logger) {
        if failure == nil {
            retryDelayMs = Self.firstRetryMs
            logger.error("store writes are failing; state changes are kept and retried", [
                "error": .string(error.description), "records": .int(records),
            ])
        } else {
            retryDelayMs = min(retryDelayMs * 2, Self.maxRetryMs)
            logger.warning("store write retry failed", [
                "error": .string(error.description), "records": .int(records), "next_retry_ms": .int(Int(retryDelayMs)),
            ])
        }
        failure = error
        retryAtMs = Timestamp.monotonicMs() + retryDelayMs
    }

    /// A batch failed for another reason while degraded: the next retry keeps its delay rather than spinning.
    mutating func keepDelay() {
        if failure != nil { retryAtMs = Timestamp.monotonicMs() + retryDelayMs }
    }

    /// A transaction committed: if nothing is left pending, a degraded spell ends. Returns the failure it ended.
    mutating func committed(nothingPending: Bool) -> StoreError? {
        guard nothingPending, let ended = failure else { return nil }
        failure = nil
        retryDelayMs = 0
        return ended
    }

    mutating func answerCommitWaiters(_ result: Result<Void, StoreError>) {
        if commitWaiters.isEmpty { return }
        for ticket in commitWaiters { ticket.complete(result) }
        commitWaiters.removeAll()
    }

    /// The pending changes, `records` of them, cannot be written (`error` is no lack of a resource): counted and
    /// logged, and reported to the commits waiting now and to the next flush. The writer then forgets them.
    mutating func gaveUp(_ error: StoreError, records: Int, status: WriterStatus, logger: Logger) {
        logger.error("store gave up state changes it cannot write", [
            "error": .string(error.description), "records": .int(records),
        ])
        status.update { $0.droppedChanges += records }
        droppedFailure = error
        answerCommitWaiters(.failure(error))
    }

    /// A flush is answered with success once nothing queued before it is left unwritten, and with (once) the failure
    /// of changes given up since the previous flush.
    mutating func answerFlush(_ ticket: WriteTicket<Void>) {
        let dropped = droppedFailure
        droppedFailure = nil
        ticket.complete(dropped.map { .failure($0) } ?? .success(()))
    }

    /// The writer stops with `unwritten` records it could not write (logged) and tells the commits still waiting.
    mutating func close(unwritten: Int, logger: Logger) {
        if unwritten > 0 {
            logger.error("store closed with state changes it could not write; their jobs resume from the stored state", [
                "records": .int(unwritten), "error": .string(failure?.description ?? ""),
            ])
        }
        answerCommitWaiters(.failure(StoreError(.closed, "store closed before the changes were written")))
    }

    /// Shows the writer's state in `status`, with `pending` records kept.
    func publish(to status: WriterStatus, pending: Int) {
        let degraded = failure
        status.update {
            $0.degraded = degraded != nil
            $0.lastError = degraded
            $0.pendingChanges = pending
        }
    }
}
