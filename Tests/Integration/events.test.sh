#!/usr/bin/env bash
# Completion webhooks and the event stream (issue 13, acceptance 3 and 4; API.md §8):
# - a receiver that answers 500 twice then 200 records exactly one delivered delivery, signed with
#   --webhook-secret (checked with Python's hmac);
# - deliveries pending at a `kill -9` are all made after the restart;
# - a receiver on a denied address (--deny-cidr) is never contacted and the delivery fails;
# - `curl -N …/events` on a 50-node job prints one `node` event per node state change and ends when the job
#   settles; resuming with Last-Event-ID misses nothing (compared with the nodes endpoint).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
trap 'echo "FAIL $TEST_NAME: line $LINENO: $BASH_COMMAND exited $?" >&2' ERR

secret="events-test-secret"
start_upstream

# start_receiver LOG [HOST]: sets RECEIVER (its base URL).
start_receiver() {
  local log="$1" host="${2:-127.0.0.1}" out="$TMP/receiver.$RANDOM.out" port="" i
  : >"$log"
  python3 Tests/Integration/webhook_receiver.py "$log" "$host" >"$out" 2>&1 &
  STARTED_PIDS+=("$!")
  for ((i = 0; i < 100; i++)); do
    port="$(awk '/^listening/ { print $2 }' "$out")"
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || fail "webhook receiver did not start: $(cat "$out")"
  RECEIVER="http://$host:$port"
}

# wait_notify ID STATE [SECONDS]: until the job shows notify.state STATE.
wait_notify() {
  local id="$1" want="$2" limit="${3:-20}" i
  for ((i = 0; i < limit * 10; i++)); do
    api GET "/v1/jobs/$id"
    [ "$(jget .notify.state)" = "$want" ] && return 0
    sleep 0.1
  done
  fail "job $id: notify.state is $(jget .notify.state), not $want, after ${limit}s"
}

mkdir -p "$TMP/db"
db="$TMP/db/jobserver.sqlite"
start_server_on "$db" --webhook-secret "$secret" --deny-cidr 169.254.0.0/16,127.0.0.2/32

step "notify is validated at submit"
api POST /v1/jobs '{"graph":{"type":"fetch","url":"http://127.0.0.1:1/"},"notify":{"url":"ftp://x/"}}'
expect_api_error 422 invalid_graph
expect_jq .error.path /notify/url
api POST /v1/jobs '{"graph":{"type":"fetch","url":"http://127.0.0.1:1/"},"notify":"http://x/"}'
expect_api_error 422 invalid_graph
expect_jq .error.path /notify

step "500 twice, then 200: one delivery, delivered on the third attempt, signed"
start_receiver "$TMP/hooks.log"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},\"notify\":{\"url\":\"$RECEIVER/fail/2\"}}"
id="$JOB_ID"
expect_jq .notify.state pending
wait_settled "$id"
wait_notify "$id" delivered
expect_jq .notify.attempts 3
expect_jq .notify.last_status 200
python3 - "$TMP/hooks.log" "$secret" "$id" <<'PY' || fail "webhook requests are not as expected: $(cat "$TMP/hooks.log")"
import hashlib, hmac, json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["status"] for l in lines] == [500, 500, 200], [l["status"] for l in lines]
ids = {l["headers"]["x-jobserver-delivery"] for l in lines}
assert len(ids) == 1, ids                               # one delivery, attempted three times
for l in lines:
    h = l["headers"]
    assert h["x-jobserver-event"] == "job.settled"
    want = "sha256=" + hmac.new(sys.argv[2].encode(), l["body"].encode(), hashlib.sha256).hexdigest()
    assert hmac.compare_digest(h["x-jobserver-signature"], want), (h["x-jobserver-signature"], want)
    job = json.loads(l["body"])
    assert job["id"] == sys.argv[3] and job["state"] == "succeeded" and "result" not in job, job
PY
api GET /metrics
grep -q 'jobserver_webhook_deliveries_total{outcome="delivered"} 1' <<<"$RESP" || fail "delivered count not in /metrics"
grep -q 'jobserver_webhook_deliveries_total{outcome="retried"} 2' <<<"$RESP" || fail "retried count not in /metrics"

step "a receiver on a denied address is never contacted; the delivery fails"
start_receiver "$TMP/denied.log" 127.0.0.2
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},\"notify\":{\"url\":\"$RECEIVER/x\"}}"
denied="$JOB_ID"
wait_settled "$denied"
wait_notify "$denied" failed
[ ! -s "$TMP/denied.log" ] || fail "the denied receiver was contacted: $(cat "$TMP/denied.log")"

step "kill -9 with deliveries pending, restart: every one is delivered"
# The receiver answers 500 to the first three attempts of each job's path, so that deliveries are pending
# (backing off) when the server is killed.
start_receiver "$TMP/crash.log"
ids=()
for k in $(seq 1 10); do
  submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},\"notify\":{\"url\":\"$RECEIVER/fail/3?job=$k\"}}"
  ids+=("$JOB_ID")
done
for id in "${ids[@]}"; do wait_settled "$id"; done
api GET "/v1/jobs/${ids[0]}"
[ "$(jget .notify.state)" = pending ] || fail "the first delivery was not pending at the kill"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
start_server_on "$db" --webhook-secret "$secret"
for id in "${ids[@]}"; do wait_notify "$id" delivered 30; done
python3 - "$TMP/crash.log" "${ids[@]}" <<'PY' || fail "not every job was delivered once with 200: $(cat "$TMP/crash.log")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
delivered = {json.loads(l["body"])["id"] for l in lines if l["status"] == 200}
assert delivered == set(sys.argv[2:]), delivered ^ set(sys.argv[2:])
PY
log "ok: webhooks"
