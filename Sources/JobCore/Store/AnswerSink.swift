import Glibc

/// An answer's text kept in an unlinked temporary file (`AnswerSink.spooled(in:)`): sent from the page cache as it
/// is read, never held in memory. The file goes with the last reference to this.
public final class SpooledAnswer: Sendable {
    /// Open for reading from offset 0 while this lives.
    public let fd: Int32
    /// The answer's length: the file's first `count` bytes.
    public let count: Int

    init(fd: Int32, count: Int) {
        self.fd = fd
        self.count = count
    }

    deinit { Glibc.close(fd) }

    /// The answer's bytes, read back (tests).
    public func bytes() throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        try out.withUnsafeMutableBytes { try AnswerSink.read(fd, into: $0, at: 0) }
        return out
    }
}

/// Where an answer's text is written: memory, or a temporary file (`spooled(in:)`) reached through a buffer of a
/// mebibyte, so that an answer of hundreds of megabytes (the nodes of a job of 100,000 fetches with their
/// results) costs a mebibyte of memory while it is written, whatever its size.
///
/// Writers append to `buffer` (or through `append`) and call `flushIfFull` between pieces; `count` is where the
/// next byte goes, and `appendCopy` copies what was written before, from the buffer, the file or (in memory) the
/// arrays given to `append(shared:)`.
public struct AnswerSink {
    /// What is written and not in the file yet: in memory, all of the answer after `pieces`.
    public var buffer: [UInt8]
    /// The temporary file, owned here until `finish`; `nil` in memory.
    private var file: FileDescriptor?
    /// In memory, the answer's arrays before `buffer`, in order: those `append(shared:)` was given, and what was
    /// written before each. Empty in a file.
    private var pieces: [[UInt8]] = []
    /// Bytes before `buffer`'s: in the file, or in `pieces`.
    private var flushed = 0
    /// A file's buffer is written out once it holds this much.
    private let flushBytes: Int

    /// Writes to memory, `capacity` bytes reserved.
    public init(capacity: Int) {
        buffer = []
        buffer.reserveCapacity(capacity)
        file = nil
        flushBytes = .max
    }

    private init(file: FileDescriptor, flushBytes: Int) {
        buffer = []
        buffer.reserveCapacity(flushBytes + (flushBytes >> 2))
        self.file = file
        self.flushBytes = flushBytes
    }

    /// Writes to a new temporary file in `directory`, unlinked at once: nothing of it is left on disk once it is
    /// closed, whatever ends the process.
    /// - Parameter flushBytes: how much is written to the file at a time (a mebibyte; less in tests).
    /// - Throws: `StoreError.io` when the file cannot be made there.
    public static func spooled(in directory: String, flushBytes: Int = 1 << 20) throws -> AnswerSink {
        AnswerSink(file: FileDescriptor(fd: try temporaryFile(in: directory)), flushBytes: max(1, flushBytes))
    }

    /// Bytes written so far: the offset of the next.
    public var count: Int { flushed + buffer.count }

    public mutating func append(_ byte: UInt8) { buffer.append(byte) }

    public mutating func append<Bytes: Collection>(contentsOf bytes: Bytes) where Bytes.Element == UInt8 {
        buffer.append(contentsOf: bytes)
    }

    /// Appends `bytes`, which in memory are kept as they are, not copied: the answer is then made of several arrays
    /// (`SettledAnswer.pieces`). Worth it only for large arrays the writer would otherwise copy whole.
    /// - Throws: `StoreError.io` when writing to the file fails.
    public mutating func append(shared bytes: [UInt8]) throws {
        guard file == nil else {
            buffer.append(contentsOf: bytes)
            return try flushIfFull()
        }
        guard !bytes.isEmpty else { return }
        let total = count + bytes.count
        if !buffer.isEmpty {
            // Room reserved for the whole answer is not kept behind what was written before.
            pieces.append(buffer.capacity > 2 * buffer.count + 4096 ? buffer.withUnsafeBufferPointer { Array($0) } : buffer)
            buffer = []
        }
        pieces.append(bytes)
        flushed = total
    }

    /// Writes the buffer to the file once it holds `flushBytes` (in memory: nothing).
    /// - Throws: `StoreError.io` when the write fails (a full disk).
    public mutating func flushIfFull() throws {
        if buffer.count >= flushBytes { try flush() }
    }

    /// Appends a copy of the bytes written at `range` before.
    /// - Throws: `StoreError.io` when the file cannot be read or written.
    mutating func appendCopy(of range: Range<Int>) throws {
        if range.lowerBound >= flushed {
            // A copy first: the buffer cannot be read while it is appended to.
            let copy = Array(buffer[(range.lowerBound - flushed)..<(range.upperBound - flushed)])
            buffer.append(contentsOf: copy)
            return
        }
        guard let file else {
            // In memory, from the pieces (and the buffer) the range spans.
            var copy: [UInt8] = []
            copy.reserveCapacity(range.count)
            var start = 0
            for piece in pieces + [buffer] {
                let from = max(range.lowerBound, start)
                let to = min(range.upperBound, start + piece.count)
                if from < to { copy.append(contentsOf: piece[(from - start)..<(to - start)]) }
                start += piece.count
            }
            return buffer.append(contentsOf: copy)
        }
        if range.upperBound > flushed { try flush() }
        let start = buffer.count
        buffer.append(contentsOf: repeatElement(0, count: range.count))
        try buffer.withUnsafeMutableBytes { all in
            try Self.read(file.fd, into: UnsafeMutableRawBufferPointer(rebasing: all[start...]), at: range.lowerBound)
        }
    }

    /// What was written: the bytes, or the file they were written to. The sink is spent.
    /// - Throws: `StoreError.io` when the last write fails.
    public mutating func finish() throws -> SettledAnswer {
        guard let file else {
            guard let first = pieces.first else { return SettledAnswer(buffer) }
            return SettledAnswer(first, pieces: pieces.dropFirst() + (buffer.isEmpty ? [] : [buffer]))
        }
        try flush()
        return SettledAnswer(file: SpooledAnswer(fd: file.take(), count: flushed))
    }

    private mutating func flush() throws {
        guard let file, !buffer.isEmpty else { return }
        let at = flushed
        try buffer.withUnsafeBytes { bytes in
            guard let base = bytes.baseAddress else { return }
            var done = 0
            while done < bytes.count {
                let n = pwrite(file.fd, base + done, bytes.count - done, off_t(at + done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw StoreError(.io, "writing an answer to its temporary file: \(Self.lastError())") }
                done += n
            }
        }
        flushed += buffer.count
        buffer.removeAll(keepingCapacity: true)
    }

    /// Reads `buffer.count` bytes at `offset` of `fd`.
    static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws {
        guard let base = buffer.baseAddress else { return }
        var done = 0
        while done < buffer.count {
            let n = pread(fd, base + done, buffer.count - done, off_t(offset + done))
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw StoreError(.io, "reading an answer's temporary file: \(lastError())") }
            done += n
        }
    }

    /// A new file in `directory`, open for reading and writing, with no name: `O_TMPFILE` where the file system
    /// has it, else a named one unlinked at once.
    private static func temporaryFile(in directory: String) throws -> Int32 {
        // `O_TMPFILE` (`__O_TMPFILE | O_DIRECTORY`), which the Glibc module does not export.
        let fd = open(directory, 0o20000000 | O_DIRECTORY | O_RDWR | O_CLOEXEC, 0o600)
        if fd >= 0 { return fd }
        var template = Array((directory.hasSuffix("/") ? directory : directory + "/").utf8CString.dropLast())
        template.append(contentsOf: "jobserver-answer-XXXXXX".utf8CString)
        let named = template.withUnsafeMutableBufferPointer { path in path.baseAddress.map { mkstemp($0) } ?? -1 }
        guard named >= 0 else {
            throw StoreError(.io, "making a temporary file for an answer in \(directory): \(lastError())")
        }
        template.withUnsafeBufferPointer { path in _ = path.baseAddress.map { unlink($0) } }
        _ = fcntl(named, F_SETFD, FD_CLOEXEC)
        return named
    }

    private static func lastError() -> String { String(cString: strerror(errno)) }
}

/// Where large answers are written: a folder for their temporary files, and the size from which they go there.
public struct AnswerSpool: Sendable {
    /// `nil`: every answer is made in memory.
    public var directory: String?
    public var thresholdBytes: Int

    public init(directory: String?, thresholdBytes: Int) {
        self.directory = directory
        self.thresholdBytes = thresholdBytes
    }

    /// Every answer made in memory.
    public static let inMemory = AnswerSpool(directory: nil, thresholdBytes: .max)

    /// The answer `write` writes, of about `estimate` bytes: to a temporary file when it is `thresholdBytes` or more
    /// and the file can be made, else in memory (as well when writing the file fails, e.g. on a full disk: the
    /// answer is then written again).
    public func answer(estimate: Int, _ write: (inout AnswerSink) throws -> Void) throws -> SettledAnswer {
        if let directory, estimate >= thresholdBytes, var sink = try? AnswerSink.spooled(in: directory) {
            do {
                try write(&sink)
                return try sink.finish()
            } catch let error as StoreError where error.kind == .io {
                // The file failed, not what is written to it.
            }
        }
        var sink = AnswerSink(capacity: estimate)
        try write(&sink)
        return try sink.finish()
    }
}

/// An open file descriptor, closed with the last reference unless taken.
private final class FileDescriptor {
    private(set) var fd: Int32

    init(fd: Int32) { self.fd = fd }

    /// The descriptor, no longer closed here.
    func take() -> Int32 {
        defer { fd = -1 }
        return fd
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }
}
