import CPostgres

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A parameter of a PostgreSQL statement: sent as text, or as binary bytes (for `bytea`).
public enum PostgresParameter: Sendable, Equatable {
    case null
    case text(String)
    case bytes([UInt8])

    public static func int(_ value: Int) -> PostgresParameter { .text(String(value)) }
    public static func int(_ value: Int64) -> PostgresParameter { .text(String(value)) }
}

/// The rows a statement returned, every value in PostgreSQL's text format (`nil` for SQL NULL).
public struct PostgresRows: Sendable, Equatable {
    public var columns: [String]
    public var rows: [[String?]]
    /// Rows inserted, updated or deleted (`PQcmdTuples`), 0 when the statement says nothing.
    public var affected: Int

    /// The value of `column` in row `row`, or nil when it is NULL, absent or out of range.
    public func value(_ row: Int, _ column: String) -> String? {
        guard row < rows.count, let index = columns.firstIndex(of: column) else { return nil }
        return rows[row][index]
    }
}

/// One `NOTIFY` received on a channel this connection listens to.
public struct PostgresNotification: Sendable, Equatable {
    public var channel: String
    public var payload: String
    public var senderPID: Int32
}

/// One libpq connection, used by one thread at a time.
///
/// Every failure is a `StoreError` whose kind follows the SQLSTATE class, so that the store's
/// policy for a full or unreachable disk (retry, `503`) applies to PostgreSQL unchanged: a lost
/// connection or a server shutting down is `unavailable`, `disk_full` / `out_of_memory` is `full`,
/// a serialization failure, deadlock or lock timeout is `busy`, an integrity violation is
/// `constraint`.
public final class PostgresConnection {
    private var raw: OpaquePointer?
    private var prepared: Set<String> = []

    /// Connects with a `postgres://` URL or a `key=value` connection string.
    /// - Throws: `StoreError` of kind `open` with libpq's reason (the password is never part of it).
    public init(url: String) throws {
        guard let connection = Self.connect(url) else { throw StoreError(.open, "libpq could not allocate a connection") }
        guard PQstatus(connection) == CONNECTION_OK else {
            let reason = Self.trimmed(PQerrorMessage(connection))
            PQfinish(connection)
            throw StoreError(.open, "cannot connect to PostgreSQL: \(reason)")
        }
        raw = connection
        // NOTICEs (e.g. "relation already exists, skipping") are not errors; libpq would print them to stderr.
        PQsetNoticeProcessor(connection, { _, _ in }, nil)
    }

    deinit { close() }

    /// Seconds a connection attempt may take unless the URL says otherwise: libpq's default is to wait for ever,
    /// which would hold the store's writer (and every submission behind it) on an unreachable host.
    static let defaultConnectTimeoutSeconds = "10"

    /// `PQconnectdbParams` with `connect_timeout` before the URL, so that a `connect_timeout` in the URL wins.
    private static func connect(_ url: String) -> OpaquePointer? {
        let keywords = ["connect_timeout", "dbname"]
        let values = [defaultConnectTimeoutSeconds, url]
        var keywordPointers: [UnsafePointer<CChar>?] = []
        var valuePointers: [UnsafePointer<CChar>?] = []
        let copies = (keywords + values).map { strdup($0) }
        defer { copies.forEach { free($0) } }
        for i in 0..<keywords.count {
            keywordPointers.append(UnsafePointer(copies[i]))
            valuePointers.append(UnsafePointer(copies[keywords.count + i]))
        }
        keywordPointers.append(nil)
        valuePointers.append(nil)
        return PQconnectdbParams(keywordPointers, valuePointers, 1)
    }

    public func close() {
        if let raw { PQfinish(raw) }
        raw = nil
        prepared.removeAll()
    }

    /// The server's process id for this connection (the sender of this connection's own `NOTIFY`s).
    public var backendPID: Int32 { raw.map { PQbackendPID($0) } ?? 0 }

    /// The socket to wait on for notifications, or -1 when closed.
    public var socket: Int32 { raw.map { PQsocket($0) } ?? -1 }

    /// Runs one or more statements without parameters (schema, `BEGIN`, `COMMIT`).
    @discardableResult
    public func execute(_ sql: String) throws -> PostgresRows {
        let connection = try open()
        return try Self.consume(PQexec(connection, sql), connection, sql)
    }

    /// Runs one statement with `$1 …` parameters.
    @discardableResult
    public func query(_ sql: String, _ parameters: [PostgresParameter] = []) throws -> PostgresRows {
        let connection = try open()
        let result = Self.withParameters(parameters) { values, lengths, formats in
            PQexecParams(connection, sql, Int32(parameters.count), nil, values, lengths, formats, 0)
        }
        return try Self.consume(result, connection, sql)
    }

    /// Runs the statement `sql`, prepared once per connection under `name`.
    @discardableResult
    public func run(prepared name: String, _ sql: String, _ parameters: [PostgresParameter] = []) throws -> PostgresRows {
        let connection = try open()
        if !prepared.contains(name) {
            _ = try Self.consume(PQprepare(connection, name, sql, Int32(parameters.count), nil), connection, sql)
            prepared.insert(name)
        }
        let result = Self.withParameters(parameters) { values, lengths, formats in
            PQexecPrepared(connection, name, Int32(parameters.count), values, lengths, formats, 0)
        }
        return try Self.consume(result, connection, sql)
    }

    /// Runs `body` in a transaction: committed if it returns, rolled back if it throws.
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try transaction(beginning: "BEGIN", body)
    }

    /// Runs `body` in the transaction that `begin` starts: committed if it returns, rolled back if it throws.
    func transaction<T>(beginning begin: String, _ body: () throws -> T) throws -> T {
        try execute(begin)
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
    }

    /// Starts listening on `channel` (an identifier: letters, digits and `_`).
    public func listen(_ channel: String) throws {
        guard !channel.isEmpty, channel.utf8.allSatisfy({ $0 == UInt8(ascii: "_") || isalnum(Int32($0)) != 0 }) else {
            throw StoreError(.io, "invalid channel name \(channel)")
        }
        try execute("LISTEN \(channel)")
    }

    /// Waits at most `timeoutMs` for notifications and returns those that arrived (possibly none).
    public func notifications(timeoutMs: Int32) throws -> [PostgresNotification] {
        let connection = try open()
        var received = Self.drain(connection)
        if !received.isEmpty { return received }
        var descriptor = pollfd(fd: PQsocket(connection), events: Int16(POLLIN), revents: 0)
        let ready = poll(&descriptor, 1, timeoutMs)
        if ready < 0 && errno != EINTR { throw StoreError(.io, "poll on the PostgreSQL socket failed: errno \(errno)") }
        guard ready > 0 else { return [] }
        guard PQconsumeInput(connection) == 1 else {
            throw StoreError(.unavailable, "lost the PostgreSQL connection: \(Self.trimmed(PQerrorMessage(connection)))")
        }
        received = Self.drain(connection)
        return received
    }

    // MARK: -

    private func open() throws -> OpaquePointer {
        guard let raw else { throw StoreError(.closed, "connection closed") }
        if PQstatus(raw) != CONNECTION_OK {
            // A server restart or a network cut: try once to connect again; the statements must be prepared anew.
            PQreset(raw)
            prepared.removeAll()
            guard PQstatus(raw) == CONNECTION_OK else {
                throw StoreError(.unavailable, "PostgreSQL is unreachable: \(Self.trimmed(PQerrorMessage(raw)))")
            }
        }
        return raw
    }

    private static func drain(_ connection: OpaquePointer) -> [PostgresNotification] {
        var out: [PostgresNotification] = []
        while let notice = PQnotifies(connection) {
            let channel = String(cString: notice.pointee.relname)
            let payload = notice.pointee.extra.map { String(cString: $0) } ?? ""
            out.append(PostgresNotification(channel: channel, payload: payload, senderPID: notice.pointee.be_pid))
            PQfreemem(notice)
        }
        return out
    }

    private static func withParameters(
        _ parameters: [PostgresParameter],
        _ body: (UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) -> OpaquePointer?
    ) -> OpaquePointer? {
        // Each value is copied once into one buffer that lives for the call.
        var storage: [UInt8] = []
        var offsets: [Int?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        for parameter in parameters {
            switch parameter {
            case .null:
                offsets.append(nil)
                lengths.append(0)
                formats.append(0)
            case .text(let text):
                offsets.append(storage.count)
                storage.append(contentsOf: text.utf8)
                storage.append(0)
                lengths.append(0)
                formats.append(0)
            case .bytes(let bytes):
                offsets.append(storage.count)
                storage.append(contentsOf: bytes)
                lengths.append(Int32(bytes.count))
                formats.append(1)
            }
        }
        return storage.withUnsafeBufferPointer { buffer -> OpaquePointer? in
            let base = buffer.baseAddress.map { UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self) }
            let values: [UnsafePointer<CChar>?] = offsets.map { offset in offset.flatMap { o in base.map { $0 + o } } }
            return values.withUnsafeBufferPointer { v in
                lengths.withUnsafeBufferPointer { l in
                    formats.withUnsafeBufferPointer { f in body(v.baseAddress, l.baseAddress, f.baseAddress) }
                }
            }
        }
    }

    /// Reads and frees a result; a failed one becomes a `StoreError`.
    private static func consume(_ result: OpaquePointer?, _ connection: OpaquePointer, _ sql: String) throws -> PostgresRows {
        guard let result else {
            throw StoreError(
                PQstatus(connection) == CONNECTION_OK ? .io : .unavailable,
                "PostgreSQL: \(trimmed(PQerrorMessage(connection)))")
        }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY:
            break
        default:
            let state = PQresultErrorField(result, cpostgres_diag_sqlstate()).map { String(cString: $0) } ?? ""
            let message = trimmed(PQresultErrorMessage(result))
            let kind: StoreError.Kind = PQstatus(connection) == CONNECTION_OK ? kind(sqlState: state) : .unavailable
            throw StoreError(kind, "\(message) [\(state)] in \(sql.prefix(80))")
        }
        let columnCount = Int(PQnfields(result))
        let rowCount = Int(PQntuples(result))
        var columns: [String] = []
        columns.reserveCapacity(columnCount)
        for c in 0..<columnCount { columns.append(PQfname(result, Int32(c)).map { String(cString: $0) } ?? "") }
        var rows: [[String?]] = []
        rows.reserveCapacity(rowCount)
        for r in 0..<rowCount {
            var row: [String?] = []
            row.reserveCapacity(columnCount)
            for c in 0..<columnCount {
                if PQgetisnull(result, Int32(r), Int32(c)) == 1 {
                    row.append(nil)
                } else {
                    row.append(PQgetvalue(result, Int32(r), Int32(c)).map { String(cString: $0) })
                }
            }
            rows.append(row)
        }
        let affected = PQcmdTuples(result).map { Int(String(cString: $0)) ?? 0 } ?? 0
        return PostgresRows(columns: columns, rows: rows, affected: affected)
    }

    /// The store's error kind for a SQLSTATE (PostgreSQL manual, appendix A).
    static func kind(sqlState: String) -> StoreError.Kind {
        switch sqlState {
        case "53100", "53200": return .full  // disk_full, out_of_memory
        case "53300", "57P01", "57P02", "57P03": return .unavailable  // too many connections, shutdown, cannot connect now
        case "40001", "40P01", "55P03", "57014": return .busy  // serialization, deadlock, lock timeout, statement timeout
        default:
            if sqlState.hasPrefix("08") { return .unavailable }  // connection exceptions
            if sqlState.hasPrefix("23") { return .constraint }  // integrity constraint violations
            return .io
        }
    }

    private static func trimmed(_ text: UnsafePointer<CChar>?) -> String {
        guard let text else { return "unknown error" }
        let message = String(cString: text).trimmingCharacters(in: .whitespacesAndNewlines)
        return message.isEmpty ? "unknown error" : message
    }
}

/// Decoding of `bytea` values read in text format (`\x` followed by hex digits).
extension PostgresRows {
    public static func bytes(fromHex text: String) -> [UInt8]? {
        let utf8 = Array(text.utf8)
        guard utf8.count >= 2, utf8[0] == UInt8(ascii: "\\"), utf8[1] == UInt8(ascii: "x"), utf8.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity((utf8.count - 2) / 2)
        var i = 2
        while i < utf8.count {
            guard let high = hexDigit(utf8[i]), let low = hexDigit(utf8[i + 1]) else { return nil }
            out.append(high << 4 | low)
            i += 2
        }
        return out
    }

    private static func hexDigit(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

extension PostgresConnection {
    /// Runs `body` in a `REPEATABLE READ READ ONLY` transaction: every read in it sees one snapshot.
    func inReadSnapshot<T>(_ body: () throws -> T) throws -> T {
        try transaction(beginning: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", body)
    }
}
