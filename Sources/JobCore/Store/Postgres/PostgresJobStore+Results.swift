// Reading results that refer to others (`ResultSource`, `result_ref`) on PostgreSQL: the rows they refer to are
// read on the same connection, in the caller's snapshot, and put together by `ResultAssembly`, as on SQLite.

extension PGRows {
    /// The job's node rows from `position` on, in position order, results as stored; only what its result needs
    /// with `forResults` (`nodeForResults`).
    static func storedNodes(
        jobID: String, from position: Int, forResults: Bool = false, db: PostgresConnection
    ) throws -> [NodeRecord] {
        let (name, columns) = forResults ? ("nodes_from_for_results", nodeForResults) : ("nodes_from", node)
        let rows = try db.run(
            prepared: name, "SELECT \(columns) FROM nodes WHERE job_id = $1 AND position >= $2 ORDER BY position",
            [.text(jobID), .int(position)])
        return try PGRows.rows(rows).map(PGRows.node)
    }

    /// The stored response bodies of the job's nodes `nodeIDs` (those found), in one round trip.
    static func bodies(jobID: String, nodeIDs: [String], db: PostgresConnection) throws -> [String: [UInt8]] {
        let rows = try db.run(
            prepared: "bodies_of", "SELECT node_id, bytes FROM bodies WHERE job_id = $1 AND node_id = ANY($2::text[])",
            [.text(jobID), PostgresLeases.array(nodeIDs)])
        var out: [String: [UInt8]] = [:]
        out.reserveCapacity(nodeIDs.count)
        for row in PGRows.rows(rows) {
            guard let id = row.string(0), let hex = row.string(1), let bytes = PostgresRows.bytes(fromHex: hex) else {
                throw StoreError(.corrupt, "a stored body of job \(jobID) is not bytea")
            }
            out[id] = bytes
        }
        return out
    }

    /// Fills in the results of one job's `nodes` (position order) that refer to others; with `target`, only
    /// in that node's subtree.
    static func assemble(_ nodes: inout [NodeRecord], jobID: String, target: Int? = nil, db: PostgresConnection) throws {
        try ResultAssembly.assemble(&nodes, target: target) { ids in try bodies(jobID: jobID, nodeIDs: ids, db: db) }
    }

    /// Fills in the job's result when its row refers to its root's (`ResultAssembly.assembleResult`), from the
    /// nodes' results alone.
    static func assembleResult(of job: inout JobRecord, db: PostgresConnection) throws {
        let id = job.id
        try ResultAssembly.assembleResult(
            of: &job, rows: { try storedNodes(jobID: id, from: $0, forResults: true, db: db) },
            bodies: { try bodies(jobID: id, nodeIDs: $0, db: db) })
    }

    /// Fills in the result of `node` (as read) when it refers to others (`ResultAssembly.assembleResult`).
    static func assembleResult(of node: inout NodeRecord, db: PostgresConnection) throws {
        let id = node.jobID
        try ResultAssembly.assembleResult(
            of: &node, rows: { try storedNodes(jobID: id, from: $0, db: db) },
            bodies: { try bodies(jobID: id, nodeIDs: $0, db: db) })
    }
}
