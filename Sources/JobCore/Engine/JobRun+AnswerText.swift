import Threads

/// The results of a running job's top-level list, each written as JSON text as its child succeeds, for the settled
/// answer that a long-poll waits for (`Engine.answer(_:live:jobID:)`).
///
/// Written at the end instead, the answer walked every result once more after the last fetch, when they had long
/// left the caches: for a list of 10,000 fetches of 1 KiB, 24 ms of a 33 ms wait from the last fetch's end to the
/// answer's first byte (`perf`), most of it in `swift_retain` on cold results. Written as each child succeeds, its
/// result is still in the cache, and the answer is the texts copied in order. Each text is the `bytes` of the
/// child's result, which is the child's entry in the list's result (`ResultAssembly.entry`): a child without a text
/// (it failed, or settled before anyone waited, or over the bound) is written from its entry then.
///
/// Bounded: all runs' texts together stay under `EngineConfiguration.settledCacheBytes`, the size of answers the
/// settled-job cache keeps (`0`: none are written; one result's text may cross it), and a run's texts go with its
/// answer, or with the run.
struct AnswerTexts: Sendable {
    /// Each child's result text, by its position among the root's children; `nil` where none was written.
    var texts: [[UInt8]?]
    /// The texts' bytes, counted in `Engine.answerTextBytes` until they go.
    var bytes = 0
    /// How many texts there are (the non-`nil` of `texts`).
    var written = 0
    /// The length of the last text written, `nil` before the first: the room the next is written into
    /// (`JSONValue.bytes(expectedCount:)`), since a list's children's results are mostly alike.
    var lastCount: Int?

    init(children: Int) {
        texts = Array(repeating: nil, count: children)
    }

    /// The list's result, `entries`, as the answer writes it: a child's text where it has one, else its entry.
    func resultText(_ entries: [JSONValue]) -> StoredResultText {
        let missing = texts.indices.reduce(0) { $0 + (texts[$1] == nil ? entries[$1].unescapedByteCount : 0) }
        let capacity = bytes + missing + entries.count + 2
        return StoredResultText(capacityBytes: capacity, fromTexts: written) { [texts] out in
            out.append(UInt8(ascii: "["))
            for k in entries.indices {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                if let text = texts[k] {
                    out.append(contentsOf: text)
                } else {
                    entries[k].append(to: &out.buffer)
                }
                try out.flushIfFull()
            }
            out.append(UInt8(ascii: "]"))
        }
    }
}

extension JobRun {
    /// Writes the root list's children's results as text from now on, as they succeed: a waiter will take the
    /// settled answer. Only for a root `list` whose result is its children's entries in order: not
    /// `fire_on_first_result` (one child's result), nor one with a `select` of it or a `recover` value in its
    /// place. On the queue.
    func writeAnswerTexts() {
        guard answerTexts == nil, !answerTextsGivenUp, engine.configuration.settledCacheBytes > 0,
            !record.state.isSettled, case .list(let options) = graph.nodes[0].kind, !options.fireOnFirstResult,
            graph.nodes[0].dataflow?.select == nil, graph.nodes[0].recover == nil
        else { return }
        answerTexts = AnswerTexts(children: graph.nodes[0].children.count)
        // The children that succeeded before anyone waited (a job's first fetches end before its 201 is sent, and
        // a long-poll comes after that) still have their results in the cache: the first few are written now.
        var caughtUp = 0
        for child in graph.nodes[0].children where nodes[child].state == .succeeded {
            // Given up meanwhile (`writeAnswerText`), there is nothing more to write.
            guard caughtUp < Self.answerTextCatchUp, answerTexts != nil else { break }
            if let result = nodes[child].result { writeAnswerText(child, result) }
            caughtUp += 1
        }
    }

    /// How many children that succeeded before the first waiter came `writeAnswerTexts` writes, at most: in one turn
    /// of the engine's queue, which every job shares.
    static let answerTextCatchUp = 1_024

    /// Keeps the text of `value`, the result of node `i` that just succeeded, if `i` is a child of the root and the
    /// run writes texts, while the engine's texts are under their bound. On the queue.
    func writeAnswerText(_ i: Int, _ value: JSONValue) {
        guard answerTexts != nil, i > 0, graph.nodes[i].parent == 0,
            engine.answerTextBytes < engine.configuration.settledCacheBytes,
            let position = Self.position(of: i, among: graph.nodes[0].children)
        else { return }
        // A child settles once, and the catch-up writes only those that settled before there were texts: each
        // position is written at most once. Changed in place: the run's is the one copy.
        var text = answerTexts?.lastCount.map { value.bytes(expectedCount: $0) } ?? value.bytes
        // Room given for a longer text is not kept: a text is held until the answer is made.
        if text.capacity > 2 * text.count + 64 { text = text.withUnsafeBufferPointer { Array($0) } }
        answerTexts?.lastCount = text.count
        answerTexts?.texts[position] = text
        answerTexts?.bytes += text.count
        answerTexts?.written += 1
        engine.answerTextBytes += text.count
        giveUpAnswerTextsIfTheyWillNotFit()
    }

    /// Drops the texts, and writes no more, once the first few show that all the children's would not fit in the
    /// room the bound leaves: then most of the answer would be written from the values at the end all the same, and
    /// a part of it held twice meanwhile. For a list of 100,000 fetches of 1 KiB (142 MB of texts) under the default
    /// bound, the job took about 5 % longer with the texts of its first 45,000 children and the server peaked about
    /// 190 MiB higher (4 runs on one server, two rounds alternated).
    private func giveUpAnswerTextsIfTheyWillNotFit() {
        guard let texts = answerTexts, texts.written >= Self.answerTextsJudgedAfter else { return }
        let room = engine.configuration.settledCacheBytes - (engine.answerTextBytes - texts.bytes)
        guard texts.bytes / texts.written * texts.texts.count > room else { return }
        _ = takeAnswerTexts()
        answerTextsGivenUp = true
    }

    /// How many texts `giveUpAnswerTextsIfTheyWillNotFit` judges the size of all by.
    static let answerTextsJudgedAfter = 4

    /// The texts written so far, no longer the run's (nor counted by the engine). On the queue.
    func takeAnswerTexts() -> AnswerTexts? {
        guard let taken = answerTexts else { return nil }
        answerTexts = nil
        engine.answerTextBytes -= taken.bytes
        return taken
    }

    /// Where `node` is in `children`, node indices in ascending (pre-order) order.
    static func position(of node: Int, among children: [Int]) -> Int? {
        var low = 0
        var high = children.count
        while low < high {
            let middle = (low + high) / 2
            if children[middle] < node { low = middle + 1 } else { high = middle }
        }
        return low < children.count && children[low] == node ? low : nil
    }
}

/// A settled list's entries written as JSON text on every core at once, for an answer made from the values at the
/// end (no texts were written as the children succeeded, as for a list whose texts would not fit the bound): each
/// core writes one run of consecutive entries into an array of its own (`CoreRuns`), and the answer is those arrays,
/// sent one after another (`AnswerSink.append(shared:)`), not copied into one. Written on one thread, with a first
/// pass that counted its length, the 142 MB answer of a list of 100,000 fetches of 1 KiB took most of the wait from
/// the last fetch's end to the answer's first byte, while the other core had nothing to do but the store's writer.
enum EntryRuns {
    /// `entries` (a list's result, `[…]`) as the answer writes it, in `runs` runs written at once; `nil` for fewer
    /// than `minimumEntries` entries (`EngineConfiguration.answerRunsMinimumEntries`) or fewer than two runs.
    static func resultText(_ entries: [JSONValue], runs: Int, minimumEntries: Int, nice: Int32) -> StoredResultText? {
        guard runs >= 2, entries.count >= max(minimumEntries, runs) else { return nil }
        let texts = write(entries, runs: runs, nice: nice)
        let capacity = texts.reduce(2) { $0 + $1.count }
        return StoredResultText(capacityBytes: capacity, fromTexts: nil) { out in
            out.append(UInt8(ascii: "["))
            for text in texts { try out.append(shared: text) }
            out.append(UInt8(ascii: "]"))
        }
    }

    /// Each run's text: its entries' compact JSON, separated by commas, without brackets; every run but the first
    /// begins with the comma that parts it from the run before. Every run has at least one entry
    /// (`runs <= entries.count`).
    /// - Parameter nice: the nice value the runs but the first are written at (the calling thread's, a read's).
    static func write(_ entries: [JSONValue], runs: Int, nice: Int32) -> [[UInt8]] {
        let texts = Locked([[UInt8]](repeating: [], count: runs))
        CoreRuns.perform(runs, nice: nice) { run in
            let text = write(entries, run: run, of: runs)
            texts.withLock { $0[run] = text }
        }
        return texts.withLock { $0 }
    }

    /// The text of run `run` of `runs`.
    private static func write(_ entries: [JSONValue], run: Int, of runs: Int) -> [UInt8] {
        let range = CoreRuns.part(run, of: runs, count: entries.count)
        // Room for the run's first entry's length for each (a list's entries are mostly alike), written in one pass
        // of one sink: each entry appended on its own was first walked to count its length, and its room zeroed.
        // The entries that do not fit, once one is longer than the first, are appended one by one, the array grown
        // by doubling.
        let unescaped = (entries[range.lowerBound].unescapedByteCount + 1) * range.count
        var next = range.lowerBound
        var text = [UInt8](unsafeUninitializedCapacity: ByteSink.room(forUnescaped: unescaped)) { buffer, initialized in
            var sink = ByteSink(buffer)
            var kept = 0
            while next < range.upperBound {
                if next > 0 { sink.append(UInt8(ascii: ",")) }
                entries[next].write(to: &sink)
                guard sink.fits else { break }
                kept = sink.needed
                next += 1
            }
            initialized = kept
        }
        for k in next..<range.upperBound {
            if k > 0 { text.append(UInt8(ascii: ",")) }
            entries[k].append(to: &text)
        }
        return text
    }
}
