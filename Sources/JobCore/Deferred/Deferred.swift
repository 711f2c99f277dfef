/// A result that is not there yet, with a chain of callbacks and errbacks to run when it arrives:
/// a port of HLDeferred (Twisted's Deferred).
///
/// Links are added with `then`, `fail`, `both` and `then(_:fail:)`. When the Deferred is fired with
/// `takeResult` or `takeError`, each link runs in turn: its callback if the current value is a result,
/// its errback if it is a `Failure`. What a link returns becomes the current value, so returning a
/// `Failure` (or throwing) switches to the error path and returning anything else switches back.
/// A link that returns another `Deferred` pauses this chain until that one has a result, which then
/// becomes the current value. Chains are run by a loop, never by recursion, so chains of Deferreds
/// nested tens of thousands deep do not grow the stack.
///
/// A Deferred is single-owner and not thread-safe: make every call on it, and fire it, from one
/// thread or serial queue (the engine's). Callbacks run synchronously on the caller of the call
/// that made them runnable (`takeResult`, `takeError`, adding a link to a fired Deferred, `cancel`).
///
/// Misuse that the original raises as an exception is thrown by the throwing methods; the
/// non-throwing ones (`then`, `fail`, `notify`, …) refuse the call, leave the Deferred unchanged and
/// record the error in `lastMisuse`.
public class Deferred {
    /// A callback: receives the current result, returns the next one (a `Failure` to fail, a
    /// `Deferred` to wait on it). Throwing is the same as returning `Failure(error)`.
    public typealias Callback = (Any?) throws -> Any?
    /// An errback: receives the current failure, returns the next value (the failure to keep failing,
    /// anything else to recover, a `Deferred` to wait on it). Throwing is the same as returning a `Failure`.
    public typealias Errback = (Failure) throws -> Any?

    fileprivate enum Link {
        case step(Callback?, Errback?)
        /// Hands the current value to a Deferred that waits on this one (notify, or a paused chain).
        case continuation(Deferred)
    }

    // Kept small on purpose: the engine holds tens of thousands of idle Deferreds.
    private var called = false
    private var finalized = false
    private var suppressAlreadyCalled = false
    private var runningCallbacks = false
    /// Waits on another Deferred (through `notify` or a paused chain); a second `notify` is refused.
    private var chained = false
    private var pauseCount: Int32 = 0
    /// Index of the next link to run; links before it have run and are dropped when the chain is exhausted.
    private var chainHead: Int32 = 0
    private var currentResult: Any?
    /// An empty array does not allocate, so an idle Deferred without links costs no storage here.
    private var chain: [Link] = []
    private var finalizer: Link?
    private var canceller: ((Deferred) -> Void)?
    /// Set while a timeout cancels this Deferred: the cancellation failure is replaced by it.
    fileprivate var cancellationReplacement: Failure?

    /// The last refused call on this Deferred (see the type's documentation), or nil.
    public private(set) var lastMisuse: DeferredError?

    /// Creates an unfired Deferred.
    /// - Parameter canceller: called by `cancel()` while the Deferred is unfired, with the Deferred;
    ///   it should stop the work and may fire the Deferred (typically with `Failure.cancellation()`).
    ///   If it leaves the Deferred unfired, `cancel()` fails it with the cancellation failure, and
    ///   a later fire then throws `alreadyCalled`. Released once the Deferred fires.
    public init(canceller: ((Deferred) -> Void)? = nil) {
        self.canceller = canceller
    }

    deinit {
        // A long chain of unfired Deferreds, each holding the next through a continuation link or a
        // paused result, would otherwise be released recursively, one stack frame group per level.
        guard !chain.isEmpty || Deferred.from(currentResult) != nil else { return }
        var pending: [Deferred] = []
        Deferred.detachReferences(chain: &chain, result: &currentResult, into: &pending)
        while var next = pending.popLast() {
            if isKnownUniquelyReferenced(&next) {
                Deferred.detachReferences(chain: &next.chain, result: &next.currentResult, into: &pending)
            }
        }
    }

    private static func detachReferences(chain: inout [Link], result: inout Any?, into pending: inout [Deferred]) {
        for link in chain {
            if case .continuation(let waiting) = link {
                pending.append(waiting)
            }
        }
        chain = []
        if let waitedOn = Deferred.from(result) {
            pending.append(waitedOn)
            result = nil
        }
    }

    /// A Deferred already fired with `result`.
    public static func withResult(_ result: Any?) -> Deferred {
        let deferred = Deferred()
        deferred.fire(result)
        return deferred
    }

    /// A Deferred already failed with `error` (wrapped in a `Failure` unless it is one).
    public static func withError(_ error: Error) -> Deferred {
        let deferred = Deferred()
        deferred.fire(Failure.wrap(error))
        return deferred
    }

    /// A new Deferred that takes `other`'s result (at the current end of `other`'s chain) when
    /// `other` fires, without letting the new one's links change `other`'s result.
    public static func observing(_ other: Deferred) -> Deferred {
        let deferred = Deferred()
        other.notify(deferred)
        return deferred
    }

    /// Whether the Deferred has been fired (including by `cancel()`).
    public var isCalled: Bool { called }

    /// Whether the chain is waiting on another Deferred (it returned one, or it is being notified).
    public var isPaused: Bool { pauseCount > 0 }

    /// Whether a finalizer has run: no more links, notifications or finalizers are accepted.
    public var isFinalized: Bool { finalized }

    /// The current value: the result, a `Failure` while failing, the awaited `Deferred` while paused
    /// on one, nil before the Deferred fired.
    public var result: Any? { currentResult }

    // MARK: Adding links

    /// Appends a link with a callback and a pass-through errback.
    @discardableResult
    public func then(_ callback: @escaping Callback) -> Deferred {
        addLink(.step(callback, nil))
    }

    /// Appends a link with an errback and a pass-through callback.
    @discardableResult
    public func fail(_ errback: @escaping Errback) -> Deferred {
        addLink(.step(nil, errback))
    }

    /// Appends a link whose one closure gets the result or the `Failure`.
    @discardableResult
    public func both(_ callback: @escaping Callback) -> Deferred {
        addLink(.step(callback, { failure in try callback(failure) }))
    }

    /// Appends a link with a callback for the result path and an errback for the error path.
    @discardableResult
    public func then(_ callback: @escaping Callback, fail errback: @escaping Errback) -> Deferred {
        addLink(.step(callback, errback))
    }

    /// Appends a callback that replaces the result with `result` (failures pass through).
    @discardableResult
    public func thenReturn(_ result: Any?) -> Deferred {
        addLink(.step({ _ in result }, nil))
    }

    private func addLink(_ link: Link) -> Deferred {
        if finalized {
            lastMisuse = .alreadyFinalized
            return self
        }
        chain.append(link)
        if called {
            runCallbacks()
        }
        return self
    }

    // MARK: Finalizers

    /// Installs the finalizer: a callback run once, after the chain is exhausted (not paused).
    /// - Throws: `DeferredError.alreadyFinalized` if there is already a finalizer or it already ran.
    @discardableResult
    public func thenFinally(_ finalizer: @escaping Callback) throws -> Deferred {
        try setFinalizer(.step(finalizer, nil))
    }

    /// Installs the finalizer: an errback run once, after the chain is exhausted, if it ends failing.
    /// - Throws: `DeferredError.alreadyFinalized` if there is already a finalizer or it already ran.
    @discardableResult
    public func failFinally(_ finalizer: @escaping Errback) throws -> Deferred {
        try setFinalizer(.step(nil, finalizer))
    }

    /// Installs the finalizer: one closure run once, after the chain is exhausted, with the result or the `Failure`.
    /// - Throws: `DeferredError.alreadyFinalized` if there is already a finalizer or it already ran.
    @discardableResult
    public func bothFinally(_ finalizer: @escaping Callback) throws -> Deferred {
        try setFinalizer(.step(finalizer, { failure in try finalizer(failure) }))
    }

    /// Installs the finalizer: a callback and an errback, one of which runs once after the chain is exhausted.
    /// - Throws: `DeferredError.alreadyFinalized` if there is already a finalizer or it already ran.
    @discardableResult
    public func thenFinally(_ finalizer: @escaping Callback, failFinally failFinalizer: @escaping Errback) throws -> Deferred {
        try setFinalizer(.step(finalizer, failFinalizer))
    }

    private func setFinalizer(_ link: Link) throws -> Deferred {
        if finalized || finalizer != nil {
            lastMisuse = .alreadyFinalized
            throw DeferredError.alreadyFinalized
        }
        finalizer = link
        if called {
            runCallbacks()
        }
        return self
    }

    // MARK: Firing

    /// Fires the chain with `result`.
    /// - Throws: `DeferredError.alreadyCalled` if already fired (silently ignored, once, after a
    ///   `cancel()` of a Deferred without canceller); `alreadyFinalized` if the finalizer ran.
    @discardableResult
    public func takeResult(_ result: Any?) throws -> Deferred {
        try startRunCallbacks(result)
        return self
    }

    /// Fires the chain on the error path with `error` (wrapped in a `Failure` unless it is one).
    /// - Throws: as `takeResult`.
    @discardableResult
    public func takeError(_ error: Error) throws -> Deferred {
        try startRunCallbacks(Failure.wrap(error))
        return self
    }

    /// Fires a Deferred known to be unfired (just created, or checked by the caller).
    func fire(_ value: Any?) {
        do {
            try startRunCallbacks(value)
        } catch {
            lastMisuse = error as? DeferredError
        }
    }

    private func startRunCallbacks(_ value: Any?) throws {
        if finalized {
            lastMisuse = .alreadyFinalized
            throw DeferredError.alreadyFinalized
        }
        if called {
            if suppressAlreadyCalled {
                suppressAlreadyCalled = false
                return
            }
            lastMisuse = .alreadyCalled
            throw DeferredError.alreadyCalled
        }
        if chained && pauseCount > 0 {
            // Fired (or cancelled) directly while waiting to be notified: it stops waiting, and the
            // notifying chain skips it later, so its first fire stands. (HLDeferred instead parks the
            // value and overwrites it with the notifier's result.)
            pauseCount -= 1
            chained = false
        }
        called = true
        canceller = nil
        currentResult = replacingCancellation(value)
        runCallbacks()
    }

    private func replacingCancellation(_ value: Any?) -> Any? {
        if let replacement = cancellationReplacement, let failure = Failure.from(value), failure.isCancellation {
            cancellationReplacement = nil
            return replacement
        }
        return value
    }

    // MARK: Chaining

    /// Makes `other` take this Deferred's current value when the chain reaches this point, without
    /// `other`'s links affecting this chain. `other` must be unfired and not already waiting on
    /// another Deferred; otherwise the call is refused (`lastMisuse` is `alreadyCalled`/`alreadyChained`).
    /// If `other` is fired or cancelled before then, it stops waiting and keeps that first value.
    @discardableResult
    public func notify(_ other: Deferred) -> Deferred {
        if finalized {
            lastMisuse = .alreadyFinalized
        } else if other.called {
            lastMisuse = .alreadyCalled
        } else if other.chained {
            lastMisuse = .alreadyChained
        } else {
            other.pauseCount += 1
            other.chained = true
            chain.append(.continuation(other))
            if called {
                runCallbacks()
            }
        }
        return self
    }

    // MARK: Cancelling

    /// Cancels the Deferred.
    ///
    /// If unfired: calls the canceller, if any; if the Deferred is still unfired afterwards, fails it
    /// with `Failure.cancellation()` (without a canceller, the one later fire is then ignored).
    /// If fired but paused on another Deferred: cancels that one. Otherwise does nothing.
    public func cancel() {
        if !called {
            if let canceller {
                canceller(self)
            } else {
                suppressAlreadyCalled = true
            }
            if !called {
                fire(Failure.cancellation())
            }
        } else if let waitedOn = Deferred.from(currentResult) {
            waitedOn.cancel()
        }
    }

    /// Cancels the Deferred as `cancel()` does, but the cancellation failure that results is
    /// replaced by `failure` when it reaches this chain.
    func cancel(replacingCancellationWith failure: Failure) {
        cancellationReplacement = failure
        cancel()
        cancellationReplacement = nil
    }

    // MARK: Abandoning

    /// Drops the links, the finalizer and the canceller without running them, for work whose owner gives it up:
    /// nothing will fire it, or nothing waits for what its chain does. A `DeferredList` and a child that never fires
    /// hold each other (the list its children, the child the link the list added to it); abandoning the child
    /// frees both. Does nothing while one of its own links runs.
    public func abandon() {
        guard !runningCallbacks else { return }
        chain = []
        chainHead = 0
        finalizer = nil
        canceller = nil
    }

    // MARK: The loop

    /// Runs chains until every Deferred reached is exhausted or paused.
    ///
    /// `stack` holds the Deferreds whose results are propagating: when a chain reaches a continuation
    /// link, the waiting Deferred is pushed and run before the rest of the current chain, exactly as
    /// the original `_runCallbacks` does, so propagation through any depth of nesting is iterative.
    private func runCallbacks() {
        if runningCallbacks {
            return  // the running loop will pick up the new links
        }
        var stack: [Deferred] = [self]
        while let current = stack.last {
            if current.pauseCount > 0 {
                // Everything below on the stack waits on this one and has to keep waiting.
                return
            }
            var finished = true
            current.called = true
            current.chained = false
            links: while Int(current.chainHead) < current.chain.count {
                let link = current.chain[Int(current.chainHead)]
                current.chainHead += 1
                switch link {
                case .continuation(let waiting):
                    if waiting.called && Deferred.from(waiting.currentResult) == nil {
                        continue links  // a notified Deferred that was fired directly meanwhile
                    }
                    waiting.currentResult = waiting.replacingCancellation(current.currentResult)
                    waiting.pauseCount -= 1
                    stack.append(waiting)
                    // Pop this Deferred only after the waiting one has run.
                    finished = false
                    break links
                case .step(let callback, let errback):
                    current.runningCallbacks = true
                    let output = Deferred.process(current.currentResult, callback, errback)
                    current.runningCallbacks = false
                    current.currentResult = output
                    guard let inner = Deferred.from(output) else { continue links }
                    if inner === current {
                        current.currentResult = Failure(DeferredError.chainedToItself)
                    } else if !inner.called || Deferred.from(inner.currentResult) != nil || inner.pauseCount > 0 {
                        // No result there yet: wait for it. The inner Deferred is not running its
                        // chain now, so the continuation can be appended directly.
                        current.pauseCount += 1
                        current.chained = true
                        inner.chain.append(.continuation(current))
                        break links
                    } else {
                        current.currentResult = inner.currentResult
                    }
                }
            }
            if finished {
                if Int(current.chainHead) >= current.chain.count {
                    // Exhausted: release the links (and what their closures hold).
                    current.chain = []
                    current.chainHead = 0
                }
                if current.pauseCount == 0, let finalizer = current.finalizer {
                    current.finalizer = nil
                    current.finalized = true
                    current.chain.append(finalizer)
                    continue  // run the finalizer before popping
                }
                stack.removeLast()
            }
        }
    }

    private static func process(_ input: Any?, _ callback: Callback?, _ errback: Errback?) -> Any? {
        do {
            if let failure = Failure.from(input) {
                guard let errback else { return input }
                return try errback(failure)
            }
            guard let callback else { return input }
            return try callback(input)
        } catch {
            return Failure.wrap(error)
        }
    }
}

extension Deferred: CustomDebugStringConvertible {
    /// The Deferred's state for debugging: unfired, paused, or its current value.
    public var debugDescription: String {
        let id = ObjectIdentifier(self)
        if !called {
            return "<Deferred \(id)\(chained ? " (notified by another Deferred)" : "")>"
        }
        if let waitedOn = Deferred.from(currentResult) {
            return "<Deferred \(id) (waiting on \(ObjectIdentifier(waitedOn)))>"
        }
        return "<Deferred \(id) (result: \(String(describing: currentResult)))>"
    }
}
