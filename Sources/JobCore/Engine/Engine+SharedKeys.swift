import Foundation

// Concurrency keys when servers share a PostgreSQL database (API.md §8, §10): the store decides which waiting job
// of a key starts (`SharedKeyAdmission`, docs/store.md "Concurrency keys"); the engine keeps its waiting runs in
// the gate until the store says they hold a slot, then begins them.

extension Engine: KeyAdmissionDelegate {
    /// The store when it keeps the concurrency keys' slots over all servers; `nil` on SQLite.
    var keyAdmission: SharedKeyAdmission? { shared as? SharedKeyAdmission }

    /// Asks for a pass over every key this server has jobs waiting on (at each heartbeat, should a notification
    /// have been lost or a slot been freed by a server that died). On the queue.
    func admitWaitingKeys() {
        guard let admission = keyAdmission else { return }
        let keys = gate.storeWaitingKeys
        if !keys.isEmpty { admission.requestKeyAdmission(keys) }
    }

    /// For a keyed job just created, on the submitting thread (which waited for the store already): one pass over
    /// its key, so that its answer shows its place and it begins at once if it may. `nil` when the store keeps no
    /// keys (SQLite), the job has none, or the pass failed (the job then waits for the next pass).
    func admitSubmitted(_ job: JobRecord) -> (holders: [String], waiting: [String])? {
        guard let key = job.concurrencyKey, job.dueAt == nil, let admission = keyAdmission else { return nil }
        do {
            return try admission.admitNow(key)
        } catch {
            logger.warning("concurrency key admission failed", ["job": .string(job.id), "error": .string("\(error)")])
            return nil
        }
    }

    /// Takes in a run created with `activate(_, hold: true)` after `admitSubmitted`'s pass. On the queue.
    func waitAfterSubmission(_ run: JobRun, _ pass: (holders: [String], waiting: [String])) {
        guard let key = run.record.concurrencyKey else { return run.begin() }
        // Another server's pass may have let it in between its own pass and now.
        if gate.waitInStore(id: run.id, key: key, submitted: true) { return run.begin() }
        gate.storePlaces(key: key, waiting: pass.waiting)
        beginStoreAdmitted(pass.holders)
    }

    /// Begins the runs waiting here that the store gave a slot. On the queue.
    func beginStoreAdmitted(_ ids: [String], heard: Bool = false) {
        var began = false
        for id in ids {
            guard gate.admittedByStore(id: id) else {
                if heard { gate.heardAdmitted(id: id) }
                continue
            }
            guard let run = runs[id], !run.record.state.isSettled, !run.stopping, !shuttingDown else { continue }
            run.begin()
            if run.hasUnwrittenChanges { markDirty(run) }
            began = true
        }
        if began { schedulePump() }
    }

    /// The job with its place among its key's waiting jobs over all servers, read from the store (on a read
    /// queue): the place this server last saw may be older.
    func withStorePosition(_ job: JobRecord) -> JobRecord {
        guard job.state == .pending, job.concurrencyKey != nil, job.dueAt == nil, let admission = keyAdmission else {
            return job
        }
        var shown = job
        do {
            shown.queuePosition = try admission.queuePosition(jobID: job.id)
        } catch {
            // The place last seen stands.
        }
        return shown
    }

    /// A listing's waiting jobs with their places over all servers, read from the store in one statement (on a
    /// read queue); unchanged if the read fails.
    func withStorePositions(_ jobs: [JobRecord]) -> [JobRecord] {
        guard let admission = keyAdmission else { return jobs }
        let waiting = Set(jobs.filter { $0.state == .pending && $0.concurrencyKey != nil && $0.dueAt == nil }.map(\.id))
        guard !waiting.isEmpty, let places = try? admission.queuePositions(jobIDs: Array(waiting)) else { return jobs }
        return jobs.map { job in
            guard waiting.contains(job.id) else { return job }
            var shown = job
            shown.queuePosition = places[job.id]
            return shown
        }
    }

    /// `readJob`'s answer with `withStorePosition`. On a read queue.
    func withStorePosition(_ read: Result<JobRead, Error>) -> Result<JobRead, Error> {
        guard case .success(.record(let job)) = read, job.state == .pending, job.concurrencyKey != nil else { return read }
        return .success(.record(withStorePosition(job)))
    }

    // MARK: KeyAdmissionDelegate (called on the store's threads)

    func keyAdmission(_ key: String, holders: [String], waiting: [String]) {
        queue.async {
            self.gate.storePlaces(key: key, waiting: waiting)
            self.beginStoreAdmitted(holders)
        }
    }

    func jobsAdmitted(_ ids: [String], key: String?) {
        queue.async {
            self.beginStoreAdmitted(ids, heard: true)
            // A pass lets in the oldest waiting jobs: those of this server that still wait moved up by as many.
            if let key { self.gate.storeMovedUp(key: key, by: ids.count) }
        }
    }
}
