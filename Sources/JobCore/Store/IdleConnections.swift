/// A store's idle reader connections (SQLite's `ReaderPool`, `PostgresReaderPool`), each handed to one thread at a
/// time: up to `keep` stay open while idle, and more are opened while many threads read at once.
final class IdleConnections<Connection>: @unchecked Sendable {
    // @unchecked: `idle` and `closed` are read and written only with `monitor` held; a connection taken from `idle`
    // or opened by `borrow` belongs to the one thread that took it until it is given back.
    private let open: @Sendable () throws -> Connection
    private let closeConnection: @Sendable (Connection) -> Void
    private let monitor = StoreMonitor()
    private var idle: [Connection] = []
    private var closed = false
    /// Connections kept open when idle.
    private let keep = 8

    init(open: @escaping @Sendable () throws -> Connection, close: @escaping @Sendable (Connection) -> Void) {
        self.open = open
        self.closeConnection = close
    }

    /// An idle connection, or a new one; fails once closed.
    func borrow() throws -> Connection {
        monitor.lock()
        if closed {
            monitor.unlock()
            throw StoreError(.closed, "store is closed")
        }
        if let connection = idle.popLast() {
            monitor.unlock()
            return connection
        }
        monitor.unlock()
        return try open()
    }

    /// Keeps `connection` for the next borrower, if `reusable`, the pool is open and not full; else closes it.
    func giveBack(_ connection: Connection, reusable: Bool = true) {
        monitor.lock()
        if reusable && !closed && idle.count < keep {
            idle.append(connection)
            monitor.unlock()
            return
        }
        monitor.unlock()
        closeConnection(connection)
    }

    /// Closes the idle connections; those borrowed are closed as they come back.
    func close() {
        monitor.lock()
        closed = true
        let connections = idle
        idle = []
        monitor.unlock()
        for connection in connections { closeConnection(connection) }
    }
}
