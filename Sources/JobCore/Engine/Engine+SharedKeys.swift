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

    /// Begins the runs waiting here that the store gave a slot. On the queue.
    func beginStoreAdmitted(_ ids: [String]) {
        var began = false
        for id in ids where gate.admittedByStore(id: id) {
            guard let run = runs[id], !run.record.state.isSettled, !run.stopping, !shuttingDown else { continue }
            run.begin()
            if run.dirtyJob || !run.dirtyNodes.isEmpty { markDirty(run) }
            began = true
        }
        if began { schedulePump() }
    }

    /// The job with its place among its key's waiting jobs over all servers, read from the store (on a read
    /// queue): the place this server last saw may be older.
    func withStorePosition(_ job: JobRecord) -> JobRecord {
        guard let admission = keyAdmission, job.state == .pending, job.concurrencyKey != nil, job.dueAt == nil else {
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

    /// `readJob`'s answer with `withStorePosition`. On a read queue.
    func withStorePosition(_ read: Result<JobRead, Error>) -> Result<JobRead, Error> {
        guard keyAdmission != nil, case .success(.record(let job)) = read else { return read }
        return .success(.record(withStorePosition(job)))
    }

    // MARK: KeyAdmissionDelegate (called on the store's threads)

    func keyAdmission(_ key: String, holders: [String], waiting: [String]) {
        queue.async {
            self.gate.storePlaces(key: key, waiting: waiting)
            self.beginStoreAdmitted(holders)
        }
    }

    func jobsAdmitted(_ ids: [String]) {
        queue.async { self.beginStoreAdmitted(ids) }
    }
}
