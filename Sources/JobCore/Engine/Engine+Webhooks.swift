extension Engine {
    /// Drops a settled job's kept answer, so that the next read shows what changed outside the engine (its
    /// webhook delivery state).
    public func forgetSettledAnswer(jobID: String) {
        settledJobs.remove(jobID)
    }
}
