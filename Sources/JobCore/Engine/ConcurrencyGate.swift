/// The jobs of each concurrency key (API.md §8): which hold one of its slots, and which wait, in submission
/// order (ids sort by creation time). Owned by the engine's queue.
struct ConcurrencyGate {
    private struct Waiting {
        var id: String
        var limit: Int
    }

    private struct KeyQueue {
        var running: Set<String> = []
        /// Waiting jobs from `head` on, sorted by id.
        var waiting: [Waiting] = []
        var head = 0

        var waitingCount: Int { waiting.count - head }

        /// Where `id` is, or would go, among the waiting jobs.
        func insertionIndex(_ id: String) -> Int {
            var low = head
            var high = waiting.count
            while low < high {
                let mid = (low + high) / 2
                if waiting[mid].id < id { low = mid + 1 } else { high = mid }
            }
            return low
        }

        mutating func compact() {
            guard head > 64, head * 2 > waiting.count else { return }
            waiting.removeFirst(head)
            head = 0
        }
    }

    private var keys: [String: KeyQueue] = [:]
    /// Jobs waiting for a slot, over all keys.
    private(set) var waitingCount = 0

    /// A job that was running when the server stopped takes a slot of `key` at once.
    mutating func resume(id: String, key: String) {
        keys[key, default: KeyQueue()].running.insert(id)
    }

    /// Puts the job in its key's queue, in submission order; `admit` says when it may start.
    mutating func enqueue(id: String, key: String, limit: Int) {
        var queue = keys[key] ?? KeyQueue()
        let index = queue.insertionIndex(id)
        if index < queue.waiting.count, queue.waiting[index].id == id { return }
        queue.waiting.insert(Waiting(id: id, limit: max(1, limit)), at: index)
        waitingCount += 1
        keys[key] = queue
    }

    /// Lets in the first waiting jobs of `key` while it has a free slot (by the first waiting job's limit) and
    /// returns them, in order: they may start now.
    mutating func admit(key: String) -> [String] {
        guard var queue = keys[key] else { return [] }
        var admitted: [String] = []
        while queue.head < queue.waiting.count, queue.running.count < queue.waiting[queue.head].limit {
            let next = queue.waiting[queue.head].id
            queue.head += 1
            queue.running.insert(next)
            admitted.append(next)
        }
        waitingCount -= admitted.count
        queue.compact()
        keys[key] = queue
        return admitted
    }

    /// The job settled (or will never start): it frees its slot, or leaves the queue.
    mutating func leave(id: String, key: String) {
        guard var queue = keys[key] else { return }
        if queue.running.remove(id) == nil {
            let index = queue.insertionIndex(id)
            if index < queue.waiting.count, queue.waiting[index].id == id {
                queue.waiting.remove(at: index)
                waitingCount -= 1
            }
        }
        if queue.running.isEmpty, queue.waitingCount == 0 {
            keys[key] = nil
        } else {
            keys[key] = queue
        }
    }

    /// 1 for the next job to start, 2 for the one after it…; `nil` when the job does not wait.
    func position(id: String, key: String) -> Int? {
        guard let queue = keys[key] else { return nil }
        let index = queue.insertionIndex(id)
        guard index < queue.waiting.count, queue.waiting[index].id == id else { return nil }
        return index - queue.head + 1
    }

    /// How many jobs of `key` hold a slot.
    func running(key: String) -> Int { keys[key]?.running.count ?? 0 }

    // MARK: Slots kept by a shared store (PostgreSQL, API.md §10)
    //
    // With servers sharing a database, the store decides which waiting job of a key starts (`SharedKeyAdmission`):
    // the gate only remembers this server's jobs that wait for it, and their places as the last pass saw them,
    // moved up since by the jobs other servers' passes let in (counted per key, so that hearing of them costs
    // nothing per waiting job).

    private struct StorePlace {
        var place: Int
        /// `movedUp[key]` when the place was seen.
        var seen: Int
    }

    /// This server's jobs waiting for the store to give them a slot: id → key.
    private var inStore: [String: String] = [:]
    /// How many of them wait on each key.
    private var inStoreByKey: [String: Int] = [:]
    private var storePlaces: [String: StorePlace] = [:]
    /// Per key with jobs waiting here: the jobs other servers let in since the first of them began waiting.
    private var movedUp: [String: Int] = [:]
    /// Ids heard let in before they waited here (a submission whose pass ran just before another server's), the
    /// newest few thousand.
    private var heardEarly: Set<String> = []
    private var heardOrder: [String] = []

    /// Jobs waiting for a slot, in memory or in the store.
    var totalWaiting: Int { waitingCount + inStore.count }

    /// The keys this server has jobs waiting on.
    var storeWaitingKeys: Set<String> { Set(inStoreByKey.keys) }

    /// The job waits for the store to give it a slot. A `submitted` job (its id is new, so what was heard of it
    /// is of this attempt) may have been heard let in already: then true, and it may begin.
    mutating func waitInStore(id: String, key: String, submitted: Bool = false) -> Bool {
        if submitted, heardEarly.remove(id) != nil { return true }
        if inStore.updateValue(key, forKey: id) == nil { inStoreByKey[key, default: 0] += 1 }
        return false
    }

    /// The store gave the job a slot: true if it was waiting here (and now no longer is).
    mutating func admittedByStore(id: String) -> Bool {
        storePlaces[id] = nil
        guard let key = inStore.removeValue(forKey: id) else { return false }
        forgetOne(key)
        return true
    }

    /// A notification let in a job not waiting here: remembered a while, should it start waiting just after.
    mutating func heardAdmitted(id: String) {
        guard heardEarly.insert(id).inserted else { return }
        heardOrder.append(id)
        if heardOrder.count > 4096 {
            for old in heardOrder.prefix(2048) { heardEarly.remove(old) }
            heardOrder.removeFirst(2048)
        }
    }

    /// The job settled or stopped here while it waited.
    mutating func leaveStore(id: String) {
        guard let key = inStore.removeValue(forKey: id) else { return }
        // The jobs of this server behind it move up.
        if let left = storePlaces.removeValue(forKey: id) {
            let place = left.place - ((movedUp[key] ?? 0) - left.seen)
            for (other, waitsOn) in inStore where waitsOn == key {
                guard let theirs = storePlaces[other] else { continue }
                if theirs.place - ((movedUp[key] ?? 0) - theirs.seen) > place { storePlaces[other]?.place -= 1 }
            }
        }
        forgetOne(key)
    }

    private mutating func forgetOne(_ key: String) {
        let left = (inStoreByKey[key] ?? 1) - 1
        inStoreByKey[key] = left > 0 ? left : nil
        if left <= 0 { movedUp[key] = nil }
    }

    /// The places of `key`'s first waiting jobs over all servers, from a pass: those of this server are kept.
    mutating func storePlaces(key: String, waiting: [String]) {
        let now = movedUp[key] ?? 0
        for (index, id) in waiting.enumerated() where inStore[id] == key {
            storePlaces[id] = StorePlace(place: index + 1, seen: now)
        }
    }

    /// Another server let in the first `count` waiting jobs of `key`.
    mutating func storeMovedUp(key: String, by count: Int) {
        guard inStoreByKey[key] != nil else { return }
        movedUp[key, default: 0] += count
    }

    func storePosition(id: String) -> Int? {
        guard let key = inStore[id], let seen = storePlaces[id] else { return nil }
        return max(1, seen.place - ((movedUp[key] ?? 0) - seen.seen))
    }
}
