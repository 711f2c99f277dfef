/// Concurrency keys over all the servers of a shared store (API.md §8, §10): the store, not the engine, decides
/// which waiting jobs of a key may start, so that `concurrency_limit` holds over all servers together.
///
/// SQLite is never shared: there the engine's `ConcurrencyGate` decides alone, and none of this is asked for.
protocol SharedKeyAdmission: AnyObject, Sendable {
    /// Lets in, soon and off the caller's thread, the oldest waiting jobs of each key while the key has a free
    /// slot over all servers; the delegate hears what each pass found, and the servers that own the jobs let in
    /// are told too. Requests for a key already asked for are merged.
    func requestKeyAdmission(_ keys: Set<String>)

    /// One pass over `key` on the caller's thread, which it holds for a round trip to the database: not for the
    /// engine's queue nor an event loop.
    func admitNow(_ key: String) throws -> (holders: [String], waiting: [String])

    /// Where the job waits among its key's waiting jobs over all servers (1: the next to start); `nil` when it
    /// waits for no slot. Reads the database: not for the engine's queue nor an event loop.
    func queuePosition(jobID: String) throws -> Int?

    /// `queuePosition` of each of `ids` that waits (the others are left out), in one read.
    func queuePositions(jobIDs: [String]) throws -> [String: Int]

    /// Admission passes run so far on this server (for measuring their cost).
    var keyAdmissionPasses: Int { get }
}

/// Told by a `SharedKeyAdmission` store which jobs may start; calls come on the store's threads and must only hand
/// the work on.
protocol KeyAdmissionDelegate: AnyObject, Sendable {
    /// A pass over `key`: `holders` hold a slot but had not started when it ran (this server begins those it
    /// keeps waiting), `waiting` are the first waiting jobs in their order.
    func keyAdmission(_ key: String, holders: [String], waiting: [String])
    /// A pass gave these jobs a slot; `key` is theirs when another server ran it (this server's jobs waiting on
    /// it moved up by as many places).
    func jobsAdmitted(_ ids: [String], key: String?)
}
