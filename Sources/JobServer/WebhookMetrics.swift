import JobCore

extension PrometheusText {
    /// `jobserver_webhook_deliveries_total` by outcome: delivered (2xx), retried (an attempt failed and will be made
    /// again), failed (given up).
    static func webhooks(_ stats: WebhookStats) -> String {
        var out = "# HELP jobserver_webhook_deliveries_total Notify webhook attempts by outcome.\n"
        out += "# TYPE jobserver_webhook_deliveries_total counter\n"
        for (outcome, count) in [("delivered", stats.delivered), ("failed", stats.failed), ("retried", stats.retried)] {
            out += "jobserver_webhook_deliveries_total{outcome=\"\(outcome)\"} \(count)\n"
        }
        return out
    }
}
