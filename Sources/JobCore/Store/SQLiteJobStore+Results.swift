// Reading results that refer to others (`ResultSource`, `result_ref`): the rows they refer to are read on the
// same connection, in the caller's snapshot, and put together by `ResultAssembly`.

extension Rows {
    /// The job's node rows from `position` on, in position order, results as stored; `columns` as `Columns.node`
    /// names them (or `NULL` for some).
    static func storedNodes(
        jobID: String, from position: Int, columns: String = Columns.node, db: SQLiteConnection
    ) throws -> [NodeRecord] {
        let statement = try db.prepare(
            "SELECT \(columns) FROM nodes WHERE job_id = ?1 AND position >= ?2 ORDER BY position")
        defer { statement.reset() }
        statement.bind(1, jobID)
        statement.bind(2, position)
        var nodes: [NodeRecord] = []
        while try statement.step() { nodes.append(try node(statement)) }
        return nodes
    }

    /// The job's nodes in position order, each with its result (assembled where it refers to others), in the
    /// caller's transaction.
    static func nodesWithResults(jobID: String, db: SQLiteConnection) throws -> [NodeRecord] {
        var nodes = try storedNodes(jobID: jobID, from: 0, db: db)
        try assemble(&nodes, jobID: jobID, db: db)
        return nodes
    }

    /// The result of the job's root, to be written as text from its nodes' rows (`ResultText`), in the caller's
    /// transaction: the rows are read now, each body when its fetch's result is written.
    static func resultText(jobID: String, db: SQLiteConnection) throws -> StoredResultText {
        let (rows, textBytes) = try resultRows(jobID: jobID, db: db)
        let sizes = try db.prepare("SELECT COALESCE(SUM(length(bytes)), 0) FROM bodies WHERE job_id = ?1")
        defer { sizes.reset() }
        sizes.bind(1, jobID)
        let bodyBytes = try sizes.step() ? sizes.int(0) : 0
        // Room for every body as base64 (4/3), the largest a body's text takes but for escapes; what is not written
        // is never touched, so it costs no memory.
        let capacity = textBytes + bodyBytes / 3 * 4 + 4 + rows.count * 16 + (1 << 16)
        let body = try bodyReader(jobID: jobID, db: db)
        return StoredResultText(capacityBytes: capacity) { out in try ResultText.write(rows, into: &out, body: body) }
    }

    /// The job's nodes in tree order, each with its result to be written as text from the rows (`ResultText`), in
    /// the caller's transaction: the rows are read now, each body when a result that holds it is written.
    static func nodeListText(jobID: String, db: SQLiteConnection) throws -> StoredNodeListText {
        // One read of the rows: each node without its result (`Columns.nodeWithoutResult`), and its result's text and
        // source, columns 17 and 18, for `ResultText`.
        let statement = try db.prepare(
            "SELECT \(Columns.nodeWithoutResult), result, result_ref FROM nodes WHERE job_id = ?1 ORDER BY position")
        var nodes: [NodeRecord] = []
        var rows: [ResultRow] = []
        do {
            defer { statement.reset() }
            statement.bind(1, jobID)
            while try statement.step() {
                let node = try node(statement)
                nodes.append(node)
                rows.append(ResultRow(
                    id: node.id, parent: node.parent, state: node.state, error: node.error, result: statement.blob(17),
                    source: try ResultSource(code: statement.optionalInt(18))))
            }
        }
        let (children, index) = ResultAssembly.tree(of: rows, id: \.id, parent: \.parent)
        var bodyBytes = [Int](repeating: 0, count: rows.count)
        let lengths = try db.prepare("SELECT node_id, length(bytes) FROM bodies WHERE job_id = ?1")
        defer { lengths.reset() }
        lengths.bind(1, jobID)
        while try lengths.step() {
            if let id = lengths.string(0), let k = index[id] { bodyBytes[k] = lengths.int(1) }
        }
        let sizes = ResultText.sizes(rows, children: children, bodyBytes: bodyBytes)
        let order = nodes.treeOrder()
        let body = try bodyReader(jobID: jobID, db: db)
        return StoredNodeListText(nodes: order.map { nodes[$0] }, resultBytes: sizes.reduce(0, +)) { out, before in
            var written: [Int: Range<Int>]? = [:]
            for (k, row) in order.enumerated() {
                before(k, &out.buffer)
                try ResultText.writeShown(rows, children: children, row: row, into: &out, written: &written, body: body)
                try out.flushIfFull()
            }
        }
    }

    /// The job's node rows as writing results as text needs them, in position order, and their results' bytes.
    private static func resultRows(jobID: String, db: SQLiteConnection) throws -> (rows: [ResultRow], textBytes: Int) {
        let statement = try db.prepare(
            "SELECT id, parent, state, error, result, result_ref FROM nodes WHERE job_id = ?1 ORDER BY position")
        defer { statement.reset() }
        statement.bind(1, jobID)
        var rows: [ResultRow] = []
        var textBytes = 0
        while try statement.step() {
            guard let id = statement.string(0) else { throw StoreError(.corrupt, "node of job \(jobID) without id") }
            let result = statement.blob(4)
            textBytes += result?.count ?? 0
            rows.append(ResultRow(
                id: id, parent: statement.string(1), state: try state(statement, 2), error: try error(statement, 3),
                result: result, source: try ResultSource(code: statement.optionalInt(5))))
        }
        return (rows, textBytes)
    }

    /// Reads the stored response body of one of the job's fetch nodes, by id, in the caller's transaction.
    private static func bodyReader(jobID: String, db: SQLiteConnection) throws -> (String) throws -> [UInt8]? {
        let body = try db.prepare("SELECT bytes FROM bodies WHERE job_id = ?1 AND node_id = ?2")
        return { nodeID in
            body.bind(1, jobID)
            body.bind(2, nodeID)
            // Reset once copied: SQLite's own copy of a body that spans pages is held until then.
            defer { body.reset() }
            return try body.step() ? body.blob(0) ?? [] : nil
        }
    }

    /// The stored response bodies of the job's nodes `nodeIDs` (those found).
    static func bodies(jobID: String, nodeIDs: [String], db: SQLiteConnection) throws -> [String: [UInt8]] {
        let statement = try db.prepare("SELECT bytes FROM bodies WHERE job_id = ?1 AND node_id = ?2")
        defer { statement.reset() }
        var out: [String: [UInt8]] = [:]
        out.reserveCapacity(nodeIDs.count)
        for id in nodeIDs {
            statement.reset()
            statement.bind(1, jobID)
            statement.bind(2, id)
            if try statement.step() { out[id] = statement.blob(0) ?? [] }
        }
        return out
    }

    /// Fills in the results of one job's `nodes` (position order) that refer to others; with `target`, only
    /// in that node's subtree.
    static func assemble(_ nodes: inout [NodeRecord], jobID: String, target: Int? = nil, db: SQLiteConnection) throws {
        try ResultAssembly.assemble(&nodes, target: target) { ids in try bodies(jobID: jobID, nodeIDs: ids, db: db) }
    }

    /// Fills in the job's result when its row refers to its root's (`ResultAssembly.assembleResult`). The nodes are
    /// read only for their results: without the requests they sent, which a read of a job of 100,000 fetches parsed
    /// and held for nothing.
    static func assembleResult(of job: inout JobRecord, db: SQLiteConnection) throws {
        let id = job.id
        try ResultAssembly.assembleResult(
            of: &job, rows: { try storedNodes(jobID: id, from: $0, columns: Columns.nodeForResults, db: db) },
            bodies: { try bodies(jobID: id, nodeIDs: $0, db: db) })
    }

    /// Fills in the result of `node` (as read) when it refers to others (`ResultAssembly.assembleResult`).
    static func assembleResult(of node: inout NodeRecord, db: SQLiteConnection) throws {
        let id = node.jobID
        try ResultAssembly.assembleResult(
            of: &node, rows: { try storedNodes(jobID: id, from: $0, db: db) },
            bodies: { try bodies(jobID: id, nodeIDs: $0, db: db) })
    }
}
