import Foundation

extension Engine {
    /// Jobs newest first, with live state for running ones, without holding the caller's thread: once the store's writer has committed what was queued before the call, the
    /// page is read, and `completion` runs, on a read queue, below the event loops' priority (a busy listing
    /// costs more CPU to read and show than any other route but the largest reads).
    /// `completion` gets `EngineError.badCursor` for a cursor this server did not hand out, or a `StoreError`.
    public func list(
        state: NodeState?, limit: Int, cursor: String?,
        _ completion: @escaping @Sendable (Result<JobPage, Error>) -> Void
    ) {
        readAfterCommit({ [self] in try listFlushed(state: state, limit: limit, cursor: cursor) }, completion)
    }

    /// The page, once the writer has committed what came before.
    private func listFlushed(state: NodeState?, limit: Int, cursor: String?) throws -> JobPage {
        var page: JobPage
        do {
            page = try store.listJobs(state: state, limit: limit, cursor: cursor)
        } catch let error as StoreError where error.kind == .badCursor {
            throw EngineError.badCursor(error.description)
        }
        queue.sync {
            for k in page.jobs.indices {
                if let live = runs[page.jobs[k].id].map(shownRecord), state == nil || live.state == state {
                    page.jobs[k] = live
                }
            }
        }
        page.jobs = withStorePositions(page.jobs)
        return page
    }
}
