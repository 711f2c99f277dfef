import Foundation
import TestSupport
import Threads
import XCTest
@testable import JobCore

/// A long-poll's settled answer written from the texts of the root list's children's results, made as each succeeded
/// (`AnswerTexts`): the same bytes as the answer made from the result as values, and made so only where the root
/// list's result is its children's entries.
final class EngineAnswerTextTests: EngineTestCase {
    private func u(_ path: String) -> String { "\"\(upstream.url(path))\"" }

    /// What the engine rendered: from the texts (`renderSettledAround`), with the bytes the values give for the same
    /// record, or from the values (`renderSettled`).
    private struct Renders {
        /// The answer written, the bytes of the record's result as values, and how many entries were copied from texts.
        var fromTexts: [(written: [UInt8], fromValues: [UInt8], texts: Int)] = []
        var fromValues = 0
    }

    private func makeRenderingEngine(
        settledCacheBytes: Int? = nil, answerRunsMinimumEntries: Int? = nil
    ) throws -> (Engine, Locked<Renders>) {
        let renders = Locked(Renders())
        let engine = try makeEngine(
            configure: { config in
                if let settledCacheBytes { config.settledCacheBytes = settledCacheBytes }
                if let answerRunsMinimumEntries { config.answerRunsMinimumEntries = answerRunsMinimumEntries }
            },
            renderSettled: { job in
                renders.withLock { $0.fromValues += 1 }
                return job.result?.bytes ?? []
            },
            renderSettledAround: { job, result in
                var sink = AnswerSink(capacity: result.capacityBytes)
                try result.write(to: &sink)
                let answer = try sink.finish()
                let made = (try answer.allBytes(), job.result?.bytes ?? [], result.fromTexts ?? -1)
                renders.withLock { $0.fromTexts.append(made) }
                return answer
            })
        return (engine, renders)
    }

    /// Runs `graph` as a job held back by another of its concurrency key until its long-poll waits, so that every
    /// child settles with the waiter there; the long-poll's answer.
    private func answerOfHeldJob(_ engine: Engine, key: String, graph: String) throws -> [UInt8] {
        let held = #""concurrency_key":"\#(key)","concurrency_limit":1"#
        let holder = try submit(engine, #"{\#(held),"graph":{"type":"fetch","url":\#(u("/hang"))}}"#).id
        let id = try submit(engine, #"{\#(held),"graph":\#(graph)}"#).id
        let answers = Watched<[JobRead]>([])
        engine.waitForAnswer(id: id, afterVersion: nil, timeoutMs: 10_000) { read in
            answers.withLock { $0.append(read) }
        }
        // The long-poll is registered in the turn it queued; the job starts only once the holder is cancelled.
        engine.queue.sync {}
        let cancelled = try engine.answer("cancel of \(holder)") { done in engine.cancel(id: holder) { done($0) } }.get()
        guard case .cancelling = cancelled else { throw UpstreamError("the holder was \(cancelled), not cancelling") }
        guard answers.wait(milliseconds: 10_000, until: { !$0.isEmpty }),
            case .settled(let settled) = answers.withLock({ $0[0] })
        else { throw UpstreamError("no settled answer: \(answers.withLock { $0 })") }
        return try settled.answer.allBytes()
    }

    func testALongPollsAnswerFromTheChildrensTextsIsTheAnswerFromTheValues() throws {
        let (engine, renders) = try makeRenderingEngine()
        let fetches = """
            {"type":"fetch","url":\(u("/json"))},{"type":"fetch","url":\(u("/status/503"))},
            {"type":"fetch","url":\(u("/json?size=3000"))}
            """
        // The children with texts: those that succeeded.
        let rows: [(name: String, graph: String, texts: Int?)] = [
            ("fetches, one failing", #"{"type":"list","children":[\#(fetches)]}"#, 2),
            (
                "errors consumed, a nested list, a recovered child and a child's select",
                #"""
                {"type":"list","consume_errors":true,"children":[\#(fetches),
                  {"type":"list","children":[{"type":"fetch","url":\#(u("/text"))}]},
                  {"type":"fetch","url":\#(u("/status/404")),"recover":{"fallback":[1,"two"]}},
                  {"type":"fetch","url":\#(u("/ids?n=2")),"select":"/body/ids"}]}
                """#,
                5
            ),
            (
                "fire_on_first_error, none failing",
                #"{"type":"list","fire_on_first_error":true,"children":[{"type":"fetch","url":\#(u("/json"))}]}"#,
                1
            ),
            (
                "fire_on_first_result: one child's result",
                #"{"type":"list","fire_on_first_result":true,"children":[\#(fetches)]}"#,
                nil
            ),
            ("a select of the root's result", #"{"type":"list","select":"/0","children":[\#(fetches)]}"#, nil),
            (
                "the root's recover value",
                #"{"type":"list","fire_on_first_error":true,"recover":[1,2,3],"children":[\#(fetches)]}"#,
                nil
            ),
            ("a sequence", #"{"type":"sequence","children":[\#(fetches)]}"#, nil),
        ]
        for (k, row) in rows.enumerated() {
            let before = renders.withLock { $0 }
            let answer = try answerOfHeldJob(engine, key: "row-\(k)", graph: row.graph)
            let after = renders.withLock { $0 }
            XCTAssertEqual(after.fromTexts.count - before.fromTexts.count, row.texts == nil ? 0 : 1, row.name)
            XCTAssertEqual(after.fromValues - before.fromValues, row.texts == nil ? 1 : 0, row.name)
            if let texts = row.texts, let made = after.fromTexts.last {
                XCTAssertEqual(made.texts, texts, "\(row.name): entries copied from texts")
                XCTAssertEqual(
                    String(decoding: made.written, as: UTF8.self), String(decoding: made.fromValues, as: UTF8.self), row.name)
                XCTAssertEqual(answer, made.written, row.name)
            }
            let held = engine.queue.sync { engine.answerTextBytes }
            XCTAssertEqual(held, 0, "\(row.name): the texts went with the answer")
        }
    }

    /// The children that succeeded before the first long-poll came are written when it comes; those still running
    /// when they succeed.
    func testTheFirstLongPollWritesTheChildrenThatAlreadySucceeded() throws {
        let (engine, _) = try makeRenderingEngine()
        let children = [u("/json"), u("/status/503"), u("/hang")].map { #"{"type":"fetch","url":\#($0)}"# }
        let id = try submit(engine, #"{"graph":{"type":"list","children":[\#(children.joined(separator: ","))]}}"#).id
        let ended = try untilJob(engine, id) {
            try engine.nodes(jobID: id, includeResults: false)?.filter { $0.state.isSettled }.count == 2
        }
        XCTAssertTrue(ended, "the first two children did not end")
        XCTAssertEqual(engine.queue.sync { engine.runs[id]?.answerTexts == nil }, true, "no texts before a long-poll")
        engine.waitForAnswer(id: id, afterVersion: nil, timeoutMs: 10_000) { _ in }
        let (texts, expected) = try engine.queue.sync { () -> ([[UInt8]?], [UInt8]?) in
            let run = try XCTUnwrap(engine.runs[id])
            return (run.answerTexts?.texts ?? [], run.nodes[1].result?.bytes)
        }
        XCTAssertEqual(texts.map { $0 != nil }, [true, false, false], "the one that succeeded")
        XCTAssertEqual(texts.first ?? nil, expected)
        XCTAssertEqual(engine.queue.sync { engine.answerTextBytes }, expected?.count)
        _ = try engine.answer("cancel of \(id)") { done in engine.cancel(id: id) { done($0) } }.get()
    }

    /// A run whose first texts show that all of them would not fit in the room the bound leaves gives them up: its
    /// answer is made from the values.
    func testARunWhoseTextsWouldNotFitGivesThemUp() throws {
        let (engine, renders) = try makeRenderingEngine(settledCacheBytes: 100_000)
        // About 1.7 KB each: 170 KB in all.
        let children = (0..<100).map { _ in #"{"type":"fetch","url":\#(u("/json?size=1500"))}"# }.joined(separator: ",")
        _ = try answerOfHeldJob(engine, key: "too-large", graph: #"{"type":"list","children":[\#(children)]}"#)
        XCTAssertEqual(renders.withLock { $0.fromTexts.count }, 0)
        XCTAssertEqual(renders.withLock { $0.fromValues }, 1)
        XCTAssertEqual(engine.queue.sync { engine.answerTextBytes }, 0)
    }

    /// Without texts, a list of many entries is written in runs at once (`EntryRuns`), one per core: the answer is
    /// the same, sent in the runs' arrays.
    func testWithoutTextsAListOfManyEntriesIsWrittenInRunsWithTheSameAnswer() throws {
        guard CoreRuns.count >= 2 else { throw XCTSkip("one core: every answer is written on one thread") }
        let (engine, renders) = try makeRenderingEngine(settledCacheBytes: 0, answerRunsMinimumEntries: 4)
        let children = (0..<5).map { k in #"{"type":"fetch","url":\#(u("/json?size=\(100 * k)"))}"# }
        let answer = try answerOfHeldJob(
            engine, key: "runs", graph: #"{"type":"list","children":[\#(children.joined(separator: ","))]}"#)
        let made = try XCTUnwrap(renders.withLock { $0.fromTexts.last })
        XCTAssertEqual(made.texts, -1, "written from the values, in runs")
        XCTAssertEqual(renders.withLock { $0.fromValues }, 0)
        XCTAssertEqual(String(decoding: made.written, as: UTF8.self), String(decoding: made.fromValues, as: UTF8.self))
        XCTAssertEqual(answer, made.written)
    }

    /// Over the engine's bound only some children have texts; the others are written from their entries, and the
    /// answer is the same.
    func testChildrenPastTheBoundAreWrittenFromTheirValues() throws {
        let (engine, renders) = try makeRenderingEngine(settledCacheBytes: 4_000)
        let children = (0..<6).map { _ in #"{"type":"fetch","url":\#(u("/json?size=1500"))}"# }.joined(separator: ",")
        let answer = try answerOfHeldJob(engine, key: "bound", graph: #"{"type":"list","children":[\#(children)]}"#)
        let made = try XCTUnwrap(renders.withLock { $0.fromTexts.last })
        // The six results are the same size; texts are written while those before come to less than the bound.
        let size = (made.written.count - 2 - 5) / 6
        XCTAssertEqual(made.texts, (4_000 + size - 1) / size, "results of \(size) bytes")
        XCTAssertLessThan(made.texts, 6)
        XCTAssertEqual(String(decoding: made.written, as: UTF8.self), String(decoding: made.fromValues, as: UTF8.self))
        XCTAssertEqual(answer, made.written)
        XCTAssertEqual(engine.queue.sync { engine.answerTextBytes }, 0)
    }
}
