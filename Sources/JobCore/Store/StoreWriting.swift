/// A store's writer, as the policy both writers share sees it (docs/store.md, *Failures*): the SQLite `StoreWriter`
/// and the `PostgresStoreWriter` give their database's statements, and `writeBatch` and `attempt` decide what is
/// written together, what is kept and retried, and who is answered what. Everything is used on the writer's thread.
protocol StoreWriting: AnyObject {
    /// State changes not committed yet.
    var pending: PendingChanges { get set }
    /// The commits and flushes to answer, and while degraded the failure and when to try again.
    var recovery: WriteRecovery { get set }
    var logger: Logger { get }
    var status: WriterStatus { get }

    /// BEGIN, `body`, COMMIT, then `committed(includesPending:)`; rolled back if any of it throws.
    func transaction(fullSync: Bool, includesPending: Bool, _ body: () throws -> Void) throws
    /// Writes `changes` in the open transaction.
    func write(_ changes: PendingChanges) throws
    /// A write of one row that changes nothing, to learn whether the database takes writes again when there is
    /// nothing else to retry.
    func probe() throws
    /// In the open transaction: the job's row and its nodes' rows, or the job an idempotency key already names.
    func create(_ request: CreateRequest) throws -> CreateOutcome
    /// In the open transaction, deletes the job's rows in every table; false if there is no such job.
    func deleteJob(_ id: String) throws -> Bool
    /// In the open transaction, deletes up to `limit` settled jobs that finished before `before` (ms); how many.
    func sweep(before: Int64, limit: Int) throws -> Int
    /// In the open transaction: the rows of a map's expansion.
    func insert(_ expansion: MapExpansionRecord) throws
    /// Before a batch: writes the changes kept while degraded in parts where one transaction could be too large for
    /// the database to take; false (and degraded again) if a part failed for lack of a resource.
    func writeKeptChangesInParts() -> Bool
}

extension StoreWriting {
    /// Merges a batch's state changes into `pending` and writes them with its other ops, or, while degraded and
    /// before the time to try again, refuses the ops at once rather than have each wait on a failing database.
    func writeBatch(_ batch: [WriteOp]) {
        defer { publish() }
        var ops: [WriteOp] = []
        for op in batch {
            switch op {
            case .changes(let changes): pending.merge(changes)
            case .committed(let ticket): recovery.awaitCommit(ticket)
            default: ops.append(op)
            }
        }
        if pending.isEmpty { recovery.answerCommitWaiters(.success(())) }
        // Nothing to write: rows that wait for their first change (`PendingChanges.unchanged`) are not written yet.
        if pending.isEmpty, ops.isEmpty, recovery.failure == nil { return }
        if let failure = recovery.failureBeforeRetry {
            let refusal = StoreError(.unavailable, "writes are failing (\(failure)); retrying", sqliteCode: failure.sqliteCode)
            for op in ops { fail(op, refusal) }
            return
        }
        attempt(ops)
    }

    /// Writes the pending changes and `ops` in one transaction; if that fails for something other than
    /// a resource, each part alone, so that one bad part fails alone.
    func attempt(_ ops: [WriteOp]) {
        if !writeKeptChangesInParts() {
            for op in ops { fail(op, recovery.failure ?? StoreError(.unavailable, "store writes are failing")) }
            return
        }
        // Degraded with nothing kept: a one-row write shows whether the database takes writes again.
        let probing = recovery.failure != nil && pending.isEmpty && ops.isEmpty
        var answers: [() -> Void] = []
        do {
            try transaction(fullSync: ops.contains { $0.needsFullSync }, includesPending: true) {
                try write(pending)
                if probing { try probe() }
                for op in ops { try apply(op, answers: &answers) }
            }
            for answer in answers { answer() }
            return
        } catch let error as StoreError where error.isResourceFailure {
            degrade(error)
            for op in ops { fail(op, error) }
            return
        } catch {
            logger.warning("store batch failed; writing its parts one by one", ["error": .string("\(error)")])
            // Still degraded if nothing below commits.
            recovery.keepDelay()
        }
        if !pending.isEmpty {
            do {
                try transaction(fullSync: false, includesPending: true) { try write(pending) }
            } catch let error as StoreError where error.isResourceFailure {
                degrade(error)
                for op in ops { fail(op, error) }
                return
            } catch {
                let storeError = error as? StoreError ?? StoreError(.io, "\(error)")
                recovery.gaveUp(storeError, records: pending.count, status: status, logger: logger)
                pending.removeAll()
            }
        }
        for op in ops {
            var single: [() -> Void] = []
            do {
                try transaction(fullSync: op.needsFullSync, includesPending: false) { try apply(op, answers: &single) }
                for answer in single { answer() }
            } catch let error as StoreError where error.isResourceFailure {
                degrade(error)
                fail(op, error)
            } catch {
                fail(op, error as? StoreError ?? StoreError(.io, "\(error)"))
            }
        }
    }

    /// Writes `op` in the open transaction, adding how to answer it once that commits to `answers`.
    func apply(_ op: WriteOp, answers: inout [() -> Void]) throws {
        switch op {
        case .create(let request, let ticket):
            let outcome = try create(request)
            answers.append { ticket.complete(.success(outcome)) }
        case .delete(let id, let ticket):
            let deleted = try deleteJob(id)
            answers.append { ticket.complete(.success(deleted)) }
        case .sweep(let before, let limit, let ticket):
            let count = try sweep(before: before, limit: limit)
            answers.append { ticket.complete(.success(count)) }
        case .barrier(let ticket):
            answers.append { [self] in recovery.answerFlush(ticket) }
        case .expand(let expansion, let ticket):
            try insert(expansion)
            answers.append { ticket.complete(.success(())) }
        case .changes, .committed:
            break  // never in `ops`: merged into `pending` and `recovery` first
        }
    }

    /// Answers `op` with `error`.
    func fail(_ op: WriteOp, _ error: StoreError) {
        switch op {
        case .create(_, let ticket): ticket.complete(.failure(error))
        case .delete(_, let ticket): ticket.complete(.failure(error))
        case .sweep(_, _, let ticket): ticket.complete(.failure(error))
        case .expand(let expansion, let ticket):
            // Its copies' rows may wait in `unchanged` (SQLite's `expandMap`); those a change has not taken out go
            // with the items.
            for node in expansion.nodes { pending.takeUnchanged(jobID: expansion.jobID, position: node.position) }
            ticket.complete(.failure(error))
        case .barrier(let ticket):
            // Nothing queued before it is left unwritten: the failure was another op's.
            if pending.isEmpty { recovery.answerFlush(ticket) } else { ticket.complete(.failure(error)) }
        case .changes, .committed:
            break  // never in `ops`: merged into `pending` and `recovery` first
        }
    }

    /// After a commit: the pending changes it included are dropped from memory, and one that leaves nothing pending
    /// ends a degraded spell.
    func committed(includesPending: Bool) {
        if includesPending { pending.removeAll() }
        let recoveredFrom = recovery.committed(nothingPending: pending.isEmpty)
        // Health first: whoever was waiting for this commit must see the store as it now is.
        publish()
        // Logged once health says so: whoever reads the line then finds the store healthy.
        if let recoveredFrom { logger.info("store writes recovered", ["after": .string(recoveredFrom.description)]) }
        if includesPending { recovery.answerCommitWaiters(.success(())) }
    }

    func degrade(_ error: StoreError) {
        status.update { $0.writeFailures += 1 }
        recovery.degrade(error, records: pending.count, logger: logger)
        // Before the ops this failure refuses are answered: whoever was refused then finds the store degraded.
        publish()
    }

    func publish() { recovery.publish(to: status, pending: pending.count) }

    /// The writer stops: one last try of what it keeps, whatever the delay, then the commits still waiting are told.
    func closing() {
        if !pending.isEmpty { attempt([]) }
        recovery.close(unwritten: pending.count, logger: logger)
    }
}
