import JobCore

/// The store's health as `/healthz` and `/metrics` show it.
enum StoreHealthText {
    /// The `/metrics` lines of the store: whether it is degraded and how many writes failed.
    /// Kept apart from `PrometheusText.render` so that the store's families stay in one place.
    static func metrics(_ health: StoreHealth) -> String {
        var out = ""
        family(&out, "jobserver_store_degraded", "gauge", "1 while store writes fail and are being retried, else 0.")
        out += "jobserver_store_degraded \(health.degraded ? 1 : 0)\n"
        family(&out, "jobserver_store_write_failures_total", "counter", "Store write transactions that failed.")
        out += "jobserver_store_write_failures_total \(health.writeFailures)\n"
        family(
            &out, "jobserver_store_pending_changes", "gauge",
            "Job, node and body records waiting for the store to take writes again.")
        out += "jobserver_store_pending_changes \(health.pendingChanges)\n"
        family(
            &out, "jobserver_store_dropped_changes_total", "counter",
            "State changes given up because the store refused them for a reason other than a resource.")
        out += "jobserver_store_dropped_changes_total \(health.droppedChanges)\n"
        return out
    }

    /// The `store` member of a degraded `/healthz` answer.
    static func json(_ health: StoreHealth) -> JSONValue {
        .object([
            JSONMember("writable", .bool(!health.degraded)),
            JSONMember("error", health.lastError.map { .string($0.kind.description) } ?? .null),
            JSONMember("pending_changes", .int(health.pendingChanges)),
            JSONMember("write_failures", .int(health.writeFailures)),
        ])
    }

    private static func family(_ out: inout String, _ name: String, _ type: String, _ help: String) {
        out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    }
}
