/// A Deferred that fires when the Deferreds it watches have fired: a port of HLDeferredList.
///
/// By default it fires, once every child has a result, with an `[Any?]` of the children's results in
/// their order — a child's `Failure` in its place, `nil` for a child whose result was nil. An empty
/// list fires at once with `[]` (unless `fireOnFirstResult`, in which case it never fires).
/// It adds one link to each child's chain when created, so it sees each child's value at that point.
public final class DeferredList: Deferred {
    /// The watched Deferreds, in the order of the results.
    public let deferreds: [Deferred]

    private var results: [Any?]
    private var finishedCount = 0
    private let fireOnFirstResult: Bool
    private let fireOnFirstError: Bool
    private let consumeErrors: Bool
    private var cancelsDeferreds = false

    /// Watches `deferreds`.
    /// - Parameters:
    ///   - fireOnFirstResult: fire with the first child result (not an array) instead of waiting for all.
    ///   - fireOnFirstError: fail with the first child `Failure` instead of waiting for all.
    ///   - consumeErrors: after recording a child's `Failure`, continue that child's chain with `nil`
    ///     instead, so the child's later errbacks do not see it.
    public init(_ deferreds: [Deferred], fireOnFirstResult: Bool = false, fireOnFirstError: Bool = false,
                consumeErrors: Bool = false) {
        self.deferreds = deferreds
        self.results = Array(repeating: nil, count: deferreds.count)
        self.fireOnFirstResult = fireOnFirstResult
        self.fireOnFirstError = fireOnFirstError
        self.consumeErrors = consumeErrors
        super.init(canceller: nil)
        if deferreds.isEmpty && !fireOnFirstResult {
            fire([Any?]())
        }
        for (index, child) in deferreds.enumerated() {
            child.both { [self] result in self.childFinished(index, result) }
        }
    }

    /// Makes `cancel()` cancel every child as well, after cancelling the list itself.
    public func cancelDeferredsWhenCancelled() {
        cancelsDeferreds = true
    }

    /// Cancels the list as `Deferred.cancel()` does, then its children if `cancelDeferredsWhenCancelled()` was called.
    public override func cancel() {
        super.cancel()
        if cancelsDeferreds {
            for child in deferreds {
                child.cancel()
            }
        }
    }

    /// Abandons the list as `Deferred.abandon()` does, and its children with it: a child that never fires (or a
    /// stand-in for one) would otherwise keep the list through the link the list added to it.
    public override func abandon() {
        super.abandon()
        for child in deferreds { child.abandon() }
    }

    private func childFinished(_ index: Int, _ result: Any?) -> Any? {
        if let inner = Deferred.from(result) {
            // Fired with a Deferred as its value: record what that one produces instead.
            inner.both { [self] innerResult in self.childFinished(index, innerResult) }
            return inner
        }
        results[index] = result
        finishedCount += 1
        let failure = Failure.from(result)
        if !isCalled {
            if failure == nil && fireOnFirstResult {
                fire(result)
            } else if let failure, fireOnFirstError {
                fire(failure)
            } else if finishedCount == results.count {
                fire(results)
            }
        }
        if failure != nil && consumeErrors {
            return nil
        }
        return result
    }
}
