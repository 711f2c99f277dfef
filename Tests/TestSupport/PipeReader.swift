import Foundation
import JobCore

/// What a child process writes to a pipe, collected on a thread of its own (so the child never blocks on a full
/// pipe), with waits that look again as each chunk arrives.
public final class PipeReader: @unchecked Sendable {
    // @unchecked: `data` and `ended` are read and written only with `changed` held; `changed` is a constant.
    private let changed = NSCondition()
    private var data = Data()
    private var ended = false

    /// Starts reading `pipe` until its end.
    public init(_ pipe: Pipe) {
        let handle = pipe.fileHandleForReading
        Thread { [self] in
            while true {
                let chunk = handle.availableData
                changed.lock()
                if chunk.isEmpty { ended = true } else { data.append(chunk) }
                changed.broadcast()
                changed.unlock()
                if chunk.isEmpty { break }
            }
        }.start()
    }

    /// Everything read so far.
    public var text: String {
        changed.lock()
        defer { changed.unlock() }
        return String(decoding: data, as: UTF8.self)
    }

    /// Waits (at most `seconds`) until `condition` holds of the text so far, looking again as each chunk arrives;
    /// false if the pipe ends or the time passes first.
    public func waitForText(_ seconds: Double, _ condition: (String) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        changed.lock()
        defer { changed.unlock() }
        while true {
            if condition(String(decoding: data, as: UTF8.self)) { return true }
            if ended || !changed.wait(until: deadline) { return false }
        }
    }

    /// Waits (at most `seconds`) for the end of the pipe: every process holding its write end has closed it.
    public func waitForEnd(_ seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        changed.lock()
        defer { changed.unlock() }
        while !ended {
            if !changed.wait(until: deadline) { return ended }
        }
        return true
    }

    /// Waits (at most `seconds`) for a jobserver's `listening` log line (JSON, one per line); the port it names.
    public func waitForListeningPort(_ seconds: Double) -> Int? {
        var port: Int?
        _ = waitForText(seconds) { text in
            for line in text.split(separator: "\n") {
                if let json = try? JSONValue.parse(String(line)), json["msg"] == "listening" {
                    port = json["port"]?.intValue
                }
            }
            return port != nil
        }
        return port
    }
}
