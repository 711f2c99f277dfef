import CSQLite

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One SQLite connection with a cache of prepared statements.
///
/// Opened with `SQLITE_OPEN_NOMUTEX`: a connection is used by one thread at a
/// time (the writer thread, or a reader borrowed from the pool), so SQLite's
/// own per-call mutex would only cost time.
final class SQLiteConnection {
    private var db: OpaquePointer?
    private var statements: [String: SQLiteStatement] = [:]
    private let busyTimeoutMs: Int32

    /// Opens `path`; `create` allows creating the file. A lock held by another
    /// connection is waited for up to `busyTimeoutMs`.
    init(path: String, create: Bool, busyTimeoutMs: Int32 = 5000) throws {
        self.busyTimeoutMs = busyTimeoutMs
        _ = Self.configured
        var flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX
        if create { flags |= SQLITE_OPEN_CREATE }
        var handle: OpaquePointer?
        let rc = sqlite3_open_v2(path, &handle, flags, nil)
        guard rc == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(handle)
            throw StoreError(.open, "cannot open \(path): \(message)", sqliteCode: rc)
        }
        db = handle
        sqlite3_extended_result_codes(handle, 1)
        sqlite3_busy_timeout(handle, busyTimeoutMs)
    }

    deinit { close() }

    /// SQLite's process-wide settings, made once before the first connection opens (which initialises SQLite):
    /// memory statistics off. Nothing reads them (`sqlite3_status`), and kept they cost every `sqlite3_malloc` and
    /// `sqlite3_free` a process-wide mutex and four counter updates: 8.4M of the store writer's 102M instructions
    /// for a job of 1,000 fetches (callgrind: docs/store.md, *Threads*). Should SQLite have been initialised
    /// before, the setting is refused and SQLite keeps its statistics: nothing else changes.
    private static let configured: Void = { _ = csqlite_disable_memory_statistics() }()

    /// Finalises every cached statement and closes the connection.
    func close() {
        for statement in statements.values { statement.finalize() }
        statements.removeAll()
        if let db { sqlite3_close_v2(db) }
        db = nil
    }

    /// Runs one or more statements that return no rows of interest (schema, pragmas).
    func execute(_ sql: String) throws {
        guard let db else { throw StoreError(.closed, "connection closed") }
        var errorMessage: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(db, sql, nil, nil, &errorMessage)
        if rc != SQLITE_OK {
            let message = errorMessage.map { String(cString: $0) } ?? String(cString: sqlite3_errmsg(db))
            sqlite3_free(errorMessage)
            throw SQLiteConnection.error(rc, "\(message) in \(sql.prefix(80))")
        }
    }

    /// The prepared statement for `sql`, compiled once per connection and reset before it is handed out.
    func prepare(_ sql: String) throws -> SQLiteStatement {
        if let cached = statements[sql] {
            cached.reset()
            return cached
        }
        guard let db else { throw StoreError(.closed, "connection closed") }
        var handle: OpaquePointer?
        let rc = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &handle, nil)
        guard rc == SQLITE_OK, let handle else {
            throw SQLiteConnection.error(rc, "\(String(cString: sqlite3_errmsg(db))) in \(sql.prefix(80))")
        }
        let statement = SQLiteStatement(handle: handle, connection: self)
        statements[sql] = statement
        return statement
    }

    /// Runs `body` with no wait for a lock another connection holds: what is busy fails at once.
    func withoutBusyWait<T>(_ body: () throws -> T) rethrows -> T {
        guard let db else { return try body() }
        sqlite3_busy_timeout(db, 0)
        defer { sqlite3_busy_timeout(db, busyTimeoutMs) }
        return try body()
    }

    /// The size of the main database's WAL file in bytes; 0 when it has none.
    var walFileBytes: Int {
        guard let db, let name = sqlite3_db_filename(db, "main") else { return 0 }
        var info = stat()
        guard stat(String(cString: name) + "-wal", &info) == 0 else { return 0 }
        return Int(info.st_size)
    }

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    var changes: Int {
        guard let db else { return 0 }
        return Int(sqlite3_changes(db))
    }

    /// True while a transaction is open.
    var inTransaction: Bool {
        guard let db else { return false }
        return sqlite3_get_autocommit(db) == 0
    }

    /// The connection's last error message.
    var lastMessage: String {
        guard let db else { return "connection closed" }
        return String(cString: sqlite3_errmsg(db))
    }

    /// A StoreError for SQLite result code `rc`.
    static func error(_ rc: Int32, _ message: String) -> StoreError {
        let kind: StoreError.Kind
        switch rc & 0xFF {
        case SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_FORMAT: kind = .corrupt
        case SQLITE_FULL: kind = .full
        case SQLITE_BUSY, SQLITE_LOCKED: kind = .busy
        case SQLITE_CONSTRAINT: kind = .constraint
        case SQLITE_CANTOPEN, SQLITE_PERM, SQLITE_READONLY: kind = .open
        default: kind = .io
        }
        return StoreError(kind, message, sqliteCode: rc)
    }
}

/// A prepared statement. Parameters and columns are numbered as in SQL
/// (parameters from 1) — columns from 0.
final class SQLiteStatement {
    private var handle: OpaquePointer?
    private unowned let connection: SQLiteConnection

    init(handle: OpaquePointer, connection: SQLiteConnection) {
        self.handle = handle
        self.connection = connection
    }

    func finalize() {
        if let handle { sqlite3_finalize(handle) }
        handle = nil
    }

    /// Clears the previous run: a reset statement no longer holds a read snapshot open.
    func reset() {
        guard let handle else { return }
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    // MARK: Binding

    func bind(_ index: Int32, _ value: String?) {
        guard let value else { return bindNull(index) }
        // Explicit length: embedded NULs survive, and "" stays an empty text rather than NULL.
        sqlite3_bind_text(handle, index, value, Int32(value.utf8.count), csqlite_transient())
    }

    func bind(_ index: Int32, _ value: Int64?) {
        guard let value else { return bindNull(index) }
        sqlite3_bind_int64(handle, index, value)
    }

    func bind(_ index: Int32, _ value: Int?) {
        bind(index, value.map(Int64.init))
    }

    func bind(_ index: Int32, _ value: Bool) {
        sqlite3_bind_int64(handle, index, value ? 1 : 0)
    }

    /// Binds JSON as its compact text; `nil` as SQL NULL (so JSON `null` and absence stay distinct).
    func bind(_ index: Int32, json value: JSONValue?) {
        guard let value else { return bindNull(index) }
        let bytes = value.bytes
        bytes.withUnsafeBufferPointer { buffer in
            buffer.baseAddress?.withMemoryRebound(to: CChar.self, capacity: buffer.count) { pointer in
                _ = sqlite3_bind_text(handle, index, pointer, Int32(buffer.count), csqlite_transient())
            }
        }
    }

    func bind(_ index: Int32, blob bytes: [UInt8]) {
        if bytes.isEmpty {
            sqlite3_bind_zeroblob(handle, index, 0)
            return
        }
        bytes.withUnsafeBytes { raw in
            _ = sqlite3_bind_blob64(handle, index, raw.baseAddress, sqlite3_uint64(raw.count), csqlite_transient())
        }
    }

    func bindNull(_ index: Int32) {
        sqlite3_bind_null(handle, index)
    }

    // MARK: Running

    /// Advances to the next row: true if there is one, false when done.
    func step() throws -> Bool {
        guard let handle else { throw StoreError(.closed, "statement finalised") }
        let rc = sqlite3_step(handle)
        switch rc {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let error = SQLiteConnection.error(rc, connection.lastMessage)
            sqlite3_reset(handle)
            throw error
        }
    }

    /// Runs a statement that returns no rows, then resets it.
    func run() throws {
        defer { reset() }
        while try step() {}
    }

    // MARK: Columns

    func isNull(_ column: Int32) -> Bool {
        sqlite3_column_type(handle, column) == SQLITE_NULL
    }

    func int64(_ column: Int32) -> Int64 {
        sqlite3_column_int64(handle, column)
    }

    func int(_ column: Int32) -> Int {
        Int(sqlite3_column_int64(handle, column))
    }

    func optionalInt64(_ column: Int32) -> Int64? {
        isNull(column) ? nil : int64(column)
    }

    func optionalInt(_ column: Int32) -> Int? {
        isNull(column) ? nil : int(column)
    }

    func string(_ column: Int32) -> String? {
        guard let text = sqlite3_column_text(handle, column) else { return nil }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
    }

    func blob(_ column: Int32) -> [UInt8]? {
        if isNull(column) { return nil }
        guard let raw = sqlite3_column_blob(handle, column) else { return [] }
        let count = Int(sqlite3_column_bytes(handle, column))
        return Array(UnsafeRawBufferPointer(start: raw, count: count))
    }

    /// Parses a JSON text column in place; `nil` for SQL NULL.
    /// - Throws: `StoreError.corrupt` if the text is not JSON.
    func json(_ column: Int32, maxDepth: Int) throws -> JSONValue? {
        guard let text = sqlite3_column_text(handle, column) else { return nil }
        let count = Int(sqlite3_column_bytes(handle, column))
        do {
            return try JSONValue.parse(UnsafeBufferPointer(start: text, count: count), maxDepth: maxDepth)
        } catch {
            let name = sqlite3_column_name(handle, column).map { String(cString: $0) } ?? "column \(column)"
            throw StoreError(.corrupt, "stored \(name) is not JSON: \(error)")
        }
    }
}

extension StoreError {
    /// Primary SQLite result codes of a resource that ran out; SQLITE_CANTOPEN is what an open
    /// fails with when the process is out of file descriptors (EMFILE, ENFILE).
    static let resourceCodes: Set<Int32> = [
        SQLITE_NOMEM, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_BUSY, SQLITE_LOCKED,
    ]
}
