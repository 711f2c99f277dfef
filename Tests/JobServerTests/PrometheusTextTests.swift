import JobCore
import XCTest

@testable import JobServer

final class PrometheusTextTests: XCTestCase {
    private func snapshot(http: [HTTPRequestCounter.Key: Int] = [:]) -> MetricsSnapshot {
        var m = MetricsSnapshot()
        m.jobsByState = [.running: 2, .succeeded: 5]
        m.nodesByState = [.pending: 3, .running: 4]
        m.activeJobs = 2
        m.pendingFetches = 6
        m.fetchesInFlight = 4
        m.responseMemoryBytes = 921600
        m.activeNodes = 14
        m.fetchOutcomes = ["succeeded": 7, "timeout": 1, "http_status": 2]
        m.latencyBucketsMs = [10, 100]
        m.latencyCounts = [3, 5, 2]
        m.latencySumMs = 1234.5
        m.latencyCount = 10
        m.httpRequests = http
        return m
    }

    func testRendersEveryFamilyWithHelpAndType() {
        let http: [HTTPRequestCounter.Key: Int] = [
            .init(route: "/v1/jobs/{id}", method: "GET", status: 200): 9,
            .init(route: "unmatched", method: "GET", status: 404): 1,
        ]
        let text = PrometheusText.render(snapshot(http: http))
        let expected = """
            # HELP jobserver_jobs Jobs by state.
            # TYPE jobserver_jobs gauge
            jobserver_jobs{state="pending"} 0
            jobserver_jobs{state="running"} 2
            jobserver_jobs{state="succeeded"} 5
            jobserver_jobs{state="failed"} 0
            jobserver_jobs{state="cancelled"} 0
            jobserver_jobs{state="skipped"} 0
            # HELP jobserver_nodes Nodes of active (pending or running) jobs by state.
            # TYPE jobserver_nodes gauge
            jobserver_nodes{state="pending"} 3
            jobserver_nodes{state="running"} 4
            jobserver_nodes{state="succeeded"} 0
            jobserver_nodes{state="failed"} 0
            jobserver_nodes{state="cancelled"} 0
            jobserver_nodes{state="skipped"} 0
            # HELP jobserver_jobs_active Pending and running jobs.
            # TYPE jobserver_jobs_active gauge
            jobserver_jobs_active 2
            # HELP jobserver_fetches_in_flight Transfers in progress.
            # TYPE jobserver_fetches_in_flight gauge
            jobserver_fetches_in_flight 4
            # HELP jobserver_fetch_queue_depth Fetches waiting for a transfer slot.
            # TYPE jobserver_fetch_queue_depth gauge
            jobserver_fetch_queue_depth 6
            # HELP jobserver_jobs_load_failures_total Stored jobs that could not be loaded at start and were failed.
            # TYPE jobserver_jobs_load_failures_total counter
            jobserver_jobs_load_failures_total 0
            # HELP jobserver_long_polls_waiting Long-polls waiting for a job to change.
            # TYPE jobserver_long_polls_waiting gauge
            jobserver_long_polls_waiting 0
            # HELP jobserver_jobs_scheduled Jobs waiting in the store for their not_before or for room (--max-active-nodes).
            # TYPE jobserver_jobs_scheduled gauge
            jobserver_jobs_scheduled 0
            # HELP jobserver_jobs_waiting_for_key Jobs waiting for a slot of their concurrency key.
            # TYPE jobserver_jobs_waiting_for_key gauge
            jobserver_jobs_waiting_for_key 0
            # HELP jobserver_response_memory_bytes Response body bytes the jobs in memory hold (bounded by --max-response-memory).
            # TYPE jobserver_response_memory_bytes gauge
            jobserver_response_memory_bytes 921600
            # HELP jobserver_active_nodes Nodes of the jobs in memory (bounded by --max-active-nodes).
            # TYPE jobserver_active_nodes gauge
            jobserver_active_nodes 14
            # HELP jobserver_fetches_total Finished fetch attempts by outcome.
            # TYPE jobserver_fetches_total counter
            jobserver_fetches_total{outcome="http_status"} 2
            jobserver_fetches_total{outcome="succeeded"} 7
            jobserver_fetches_total{outcome="timeout"} 1
            # HELP jobserver_fetch_duration_seconds Fetch attempt durations.
            # TYPE jobserver_fetch_duration_seconds histogram
            jobserver_fetch_duration_seconds_bucket{le="0.01"} 3
            jobserver_fetch_duration_seconds_bucket{le="0.1"} 8
            jobserver_fetch_duration_seconds_bucket{le="+Inf"} 10
            jobserver_fetch_duration_seconds_sum 1.2345
            jobserver_fetch_duration_seconds_count 10
            # HELP jobserver_http_requests_total Answered HTTP requests by route, method and status.
            # TYPE jobserver_http_requests_total counter
            jobserver_http_requests_total{route="/v1/jobs/{id}",method="GET",status="200"} 9
            jobserver_http_requests_total{route="unmatched",method="GET",status="404"} 1
            # HELP jobserver_rate_limit_wait_seconds_total Time fetches spent ready to start but held back by --host-rate.
            # TYPE jobserver_rate_limit_wait_seconds_total counter
            jobserver_rate_limit_wait_seconds_total 0
            # HELP jobserver_rate_limited_fetches_total Fetches held back by --host-rate before they started.
            # TYPE jobserver_rate_limited_fetches_total counter
            jobserver_rate_limited_fetches_total 0
            # HELP jobserver_coalesced_fetches_total Fetches that shared an identical transfer in flight instead of making a request.
            # TYPE jobserver_coalesced_fetches_total counter
            jobserver_coalesced_fetches_total 0
            # HELP jobserver_cache_lookups_total cache: use fetches by outcome.
            # TYPE jobserver_cache_lookups_total counter
            jobserver_cache_lookups_total{outcome="hit"} 0
            jobserver_cache_lookups_total{outcome="revalidated"} 0
            jobserver_cache_lookups_total{outcome="miss"} 0
            # HELP jobserver_cache_bytes Bytes of responses the HTTP cache holds.
            # TYPE jobserver_cache_bytes gauge
            jobserver_cache_bytes 0
            # HELP jobserver_cache_entries Responses the HTTP cache holds.
            # TYPE jobserver_cache_entries gauge
            jobserver_cache_entries 0

            """
        XCTAssertEqual(text, expected)
    }

    func testHistogramAcceptsAnExplicitInfinityBucket() {
        var m = snapshot()
        m.latencyBucketsMs = [10, .infinity]
        m.latencyCounts = [4, 6]
        let text = PrometheusText.render(m)
        XCTAssertTrue(text.contains("jobserver_fetch_duration_seconds_bucket{le=\"0.01\"} 4\n"))
        XCTAssertTrue(text.contains("jobserver_fetch_duration_seconds_bucket{le=\"+Inf\"} 10\n"))
        XCTAssertEqual(text.components(separatedBy: "le=\"+Inf\"").count, 2)
    }

    func testHistogramWithoutCountsStillHasInfinityBucket() {
        var m = snapshot()
        m.latencyBucketsMs = []
        m.latencyCounts = []
        m.latencyCount = 0
        let text = PrometheusText.render(m)
        XCTAssertTrue(text.contains("jobserver_fetch_duration_seconds_bucket{le=\"+Inf\"} 0\n"))
    }

    func testLabelValuesAreEscaped() {
        XCTAssertEqual(PrometheusText.escapeLabel(#"a"b\c"# + "\nd"), #"a\"b\\c\nd"#)
        let http: [HTTPRequestCounter.Key: Int] = [.init(route: "/x\"y", method: "GET", status: 200): 1]
        let text = PrometheusText.render(snapshot(http: http))
        XCTAssertTrue(text.contains(#"route="/x\"y""#))
    }

    func testNumbers() {
        XCTAssertEqual(PrometheusText.number(3), "3")
        XCTAssertEqual(PrometheusText.number(0.005), "0.005")
        XCTAssertEqual(PrometheusText.number(2.5), "2.5")
        XCTAssertEqual(PrometheusText.number(.infinity), "+Inf")
        XCTAssertEqual(PrometheusText.number(.nan), "NaN")
    }

    func testCounterCountsByRouteMethodAndStatus() {
        let counter = HTTPRequestCounter()
        DispatchQueue.concurrentPerform(iterations: 100) { _ in
            counter.record(route: "/healthz", method: "GET", status: 200)
        }
        counter.record(route: nil, method: "GET", status: 404)
        XCTAssertEqual(counter.snapshot[.init(route: "/healthz", method: "GET", status: 200)], 100)
        XCTAssertEqual(counter.snapshot[.init(route: "unmatched", method: "GET", status: 404)], 1)
    }
}
