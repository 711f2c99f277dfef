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
}
