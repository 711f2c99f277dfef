extension Deferred {
    /// If not fired within `milliseconds`, cancels itself (so what it waits on is cancelled too) and
    /// continues its chain with a Failure wrapping `error()` instead of the cancellation. Returns self.
    ///
    /// The timeout covers the links added before this call: the timer is cancelled when the chain
    /// reaches this point (a link appended now) with a value, so a Deferred paused on another one
    /// returned by an earlier link is still timed. Cancelling follows `cancel()`: the canceller runs,
    /// or the awaited Deferred is cancelled. The timer does not keep the Deferred alive.
    /// A finalized Deferred is refused (`lastMisuse` becomes `alreadyFinalized`) and no timer is set.
    @discardableResult
    public func timeout(afterMilliseconds milliseconds: Int, scheduler: DeferredScheduler,
                        error: @escaping () -> Error) -> Deferred {
        if isFinalized {
            return then { $0 }  // records the refusal
        }
        let timer = scheduler.schedule(afterMilliseconds: milliseconds) { [weak self] in
            self?.cancel(replacingCancellationWith: Failure.wrap(error()))
        }
        return both { value in
            timer.cancel()
            return value
        }
    }
}
