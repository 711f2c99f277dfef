/// A misuse of a `Deferred`, or the reason a `Deferred` failed on its own account.
///
/// A struct over a private code so that adding a case breaks no caller; compare with the static members.
public struct DeferredError: Error, Equatable, Sendable, CustomStringConvertible {
    private enum Code: Sendable {
        case alreadyCalled
        case alreadyFinalized
        case alreadyChained
        case cancelled
        case chainedToItself
    }

    private let code: Code

    private init(_ code: Code) {
        self.code = code
    }

    /// `takeResult`/`takeError` on a Deferred that has already been fired, or `notify` of one that has.
    public static let alreadyCalled = DeferredError(.alreadyCalled)
    /// A link, a notification, a second finalizer or a fire after the finalizer was installed or ran.
    public static let alreadyFinalized = DeferredError(.alreadyFinalized)
    /// `notify` of a Deferred that already waits on another Deferred.
    public static let alreadyChained = DeferredError(.alreadyChained)
    /// The error inside the distinguished cancellation `Failure` (see `Failure.cancellation()`).
    public static let cancelled = DeferredError(.cancelled)
    /// A callback returned the very Deferred it belongs to, which could never resume.
    public static let chainedToItself = DeferredError(.chainedToItself)

    /// A readable explanation of the error.
    public var description: String {
        switch code {
        case .alreadyCalled: return "the Deferred has already been called"
        case .alreadyFinalized: return "the Deferred has already been finalized (or already has a finalizer)"
        case .alreadyChained: return "the Deferred is already chained to another Deferred"
        case .cancelled: return "the Deferred was cancelled"
        case .chainedToItself: return "a callback returned the Deferred it belongs to"
        }
    }
}

/// The value that travels down the error path of a `Deferred` chain.
///
/// A callback or errback returning a `Failure` switches the chain to (or keeps it on) the error path;
/// returning anything else switches it back to the result path.
public final class Failure: Error, CustomStringConvertible {
    /// The wrapped error; never itself a `Failure`.
    public let error: Error

    /// Whether this is the failure a `Deferred` takes when it is cancelled.
    public var isCancellation: Bool {
        (error as? DeferredError) == .cancelled
    }

    /// Wraps `error`; a `Failure` passed in is unwrapped first, so failures never nest.
    public init(_ error: Error) {
        if let failure = error as? Failure {
            self.error = failure.error
        } else {
            self.error = error
        }
    }

    /// A new distinguished cancellation failure (`isCancellation == true`).
    public static func cancellation() -> Failure {
        Failure(DeferredError.cancelled)
    }

    /// `error` itself when it is a `Failure`, else a new `Failure` wrapping it.
    public static func wrap(_ error: Error) -> Failure {
        (error as? Failure) ?? Failure(error)
    }

    /// `Failure(<wrapped error>)`.
    public var description: String {
        "Failure(\(error))"
    }
}
