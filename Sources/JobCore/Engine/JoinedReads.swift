import Threads

/// Reads of one thing at once, made once: a read that finds another of the same key under way joins it rather than
/// reading, assembling and showing a settled job of many results again. No thread waits: the joined completions run
/// when the first read ends, on its thread.
final class JoinedReads<Answer: Sendable>: Sendable {
    /// The completions that joined each read under way, by key (watched by tests).
    let underWay = Watched<[String: [@Sendable (Result<Answer, Error>) -> Void]]>([:])

    /// Answers `completion` with what `make` gives, or, when a read of `key` is under way, with what that one gives.
    func read(
        _ key: String, _ completion: @escaping @Sendable (Result<Answer, Error>) -> Void, make: () throws -> Answer
    ) {
        let first = underWay.withLock { reads -> Bool in
            guard reads[key] == nil else {
                reads[key]?.append(completion)
                return false
            }
            reads[key] = []
            return true
        }
        guard first else { return }
        let answer = Result { try make() }
        let joined = underWay.withLock { $0.removeValue(forKey: key) ?? [] }
        completion(answer)
        for join in joined { join(answer) }
    }
}
