#!/usr/bin/env bash
# Completion webhooks and the event stream (issue 13, acceptance 3 and 4; API.md §8):
# - a receiver that answers 500 twice then 200 records exactly one delivered delivery, signed with
#   --webhook-secret (checked with Python's hmac);
# - deliveries pending at a `kill -9` are all made after the restart;
# - a receiver on a denied address (--deny-cidr) is never contacted and the delivery fails; one that always
#   fails is given up after --webhook-retry-for;
# - `curl -N …/events` on a 50-node job prints one `node` event per node state change and ends when the job
#   settles; resuming with Last-Event-ID misses nothing (compared with the nodes endpoint);
# - 1,000 streams on one job (bench/events_clients.py, one asyncio thread) add no server thread.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
trap 'echo "FAIL $TEST_NAME: line $LINENO: $BASH_COMMAND exited $?" >&2' ERR

secret="events-test-secret"
start_upstream

# start_receiver LOG [HOST]: sets RECEIVER (its base URL).
start_receiver() {
  local log="$1" host="${2:-127.0.0.1}" out="$TMP/receiver.$RANDOM.out" pid
  : >"$log"
  python3 Tests/Integration/webhook_receiver.py "$log" "$host" >"$out" 2>&1 &
  pid=$!
  STARTED_PIDS+=("$pid")
  await_listening "$out" "$pid"
  RECEIVER="http://$host:$LISTENING_PORT"
}

mkdir -p "$TMP/db"
db="$TMP/db/jobserver.sqlite"
flags=(--webhook-secret "$secret" --deny-cidr 169.254.0.0/16,127.0.0.2/32 --webhook-retry-for 10s)
start_server_on "$db" "${flags[@]}"

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

step "a receiver that always fails: retried until --webhook-retry-for, then failed (checked at the end)"
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},\"notify\":{\"url\":\"$RECEIVER/fail/1000\"}}"
always_failing="$JOB_ID"

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
start_server_on "$db" "${flags[@]}"
for id in "${ids[@]}"; do wait_notify "$id" delivered 30; done
python3 - "$TMP/crash.log" "${ids[@]}" <<'PY' || fail "not every job was delivered once with 200: $(cat "$TMP/crash.log")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
delivered = {json.loads(l["body"])["id"] for l in lines if l["status"] == 200}
assert delivered == set(sys.argv[2:]), delivered ^ set(sys.argv[2:])
PY
log "ok: webhooks"

step "curl -N …/events on a 50-node job: one node event per state change, ends when the job settles"
# A sequence whose first fetch waits 1.5 s, so that the streams below are open before the list starts; the
# list's 47 fetches run 4 at a time. 50 nodes, each pending -> running -> succeeded: 100 state changes.
children="$(python3 -c "import json; print(json.dumps([{'type': 'fetch', 'url': '$UPSTREAM/delay/150'} for _ in range(47)]))")"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/1500\"},{\"type\":\"list\",\"concurrency\":4,\"children\":$children}]}}"
sse="$JOB_ID"
# since=0: the nodes that changed before the stream opened come first, so the stream holds every state reached.
curl -sN --max-time 40 "$BASE/v1/jobs/$sse/events?since=0" >"$TMP/sse-full.txt" &
full_pid=$!
# Another stream is cut after 40 node events, then resumed with Last-Event-ID while the job still runs.
python3 - "$BASE/v1/jobs/$sse/events" "$TMP/sse-part" <<'PY' &
import sys, urllib.request
url, out = sys.argv[1], sys.argv[2]

def read(headers, stop_after):
    """Reads events until the stream ends or `stop_after` node events came; returns (events, last id)."""
    events, event, last_id, nodes = [], {}, None, 0
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=40) as r:
        assert r.headers["Content-Type"] == "text/event-stream", r.headers["Content-Type"]
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line == "":
                if event:
                    events.append(event)
                    last_id = event.get("id", last_id)
                    if event.get("event") == "node":
                        nodes += 1
                        if nodes == stop_after:
                            break
                event = {}
            elif not line.startswith(":"):
                k, _, v = line.partition(": ")
                event[k] = v
    return events, last_id

first, last_id = read({}, 40)
second, _ = read({"Last-Event-ID": last_id}, None)
with open(out + ".first", "w") as f:
    f.write("\n".join(e["data"] for e in first if e["event"] == "node") + "\n")
with open(out + ".second", "w") as f:
    f.write("\n".join(e["data"] for e in second if e["event"] == "node") + "\n")
with open(out + ".id", "w") as f:
    f.write(last_id + "\n")
PY
part_pid=$!
wait "$full_pid" || fail "curl -N did not end cleanly when the job settled"
wait "$part_pid" || fail "the resumed stream failed"
api GET "/v1/jobs/$sse/nodes"
expect_status 200
echo "$RESP" >"$TMP/sse-nodes.json"
python3 - "$TMP/sse-full.txt" "$TMP/sse-nodes.json" "$TMP/sse-part" <<'PY' || fail "the event stream is not as expected"
import json, sys
text = open(sys.argv[1]).read()
events = []
for block in text.split("\n\n"):
    fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
    if fields:
        events.append(fields)
nodes = json.load(open(sys.argv[2]))["nodes"]
assert len(nodes) == 50, len(nodes)
node_events = [json.loads(e["data"]) for e in events if e["event"] == "node"]
pairs = [(n["id"], n["state"]) for n in node_events]
assert len(pairs) == len(set(pairs)), "a state change was sent twice"
assert len(node_events) == 100, f"{len(node_events)} node events, not 100 (one per state change)"
for n in nodes:
    assert (n["id"], "running") in pairs and (n["id"], "succeeded") in pairs, n["id"]
    assert all("result" not in e for e in node_events)
jobs = [json.loads(e["data"]) for e in events if e["event"] == "job"]
assert jobs[0]["state"] in ("running", "pending") and jobs[-1]["state"] == "succeeded", [j["state"] for j in jobs]
assert events[-1]["event"] == "job", "the stream ends with the job"
ids = [int(e["id"]) for e in events]
assert ids == sorted(ids), "ids are the job's versions, in order"
# The stream cut after 40 node events and resumed from its last id: each node's last state seen is the
# node's state, for all 50 nodes.
seen = {}
for part in (".first", ".second"):
    for line in open(sys.argv[3] + part):
        if line.strip():
            n = json.loads(line)
            seen[n["id"]] = n["state"]
assert seen == {n["id"]: n["state"] for n in nodes}, "the resumed stream missed a change"
print(f"{len(events)} events; resumed from id {open(sys.argv[3] + '.id').read().strip()}")
PY

step "1,000 streams on one job hold no thread each"
threads() { awk '/^Threads:/ {print $2}' "/proc/$SERVER_PID/status"; }
children="$(python3 -c "import json; print(json.dumps([{'type': 'fetch', 'url': '$UPSTREAM/delay/50'} for _ in range(10)]))")"
submit "{\"graph\":{\"type\":\"sequence\",\"children\":[{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/3000\"},{\"type\":\"list\",\"children\":$children}]}}"
before="$(threads)"
python3 bench/events_clients.py sse 127.0.0.1 "$SERVER_PORT" "$JOB_ID" 1000 >"$TMP/many.out" 2>"$TMP/many.err" &
many_pid=$!
next_line "$TMP/many.out" 0 10 "$many_pid" '^ready' >/dev/null || fail "1,000 streams did not open: $(cat "$TMP/many.err")"
following="$(threads)"
names="$(cat /proc/"$SERVER_PID"/task/*/comm | sort | uniq -c | sort -rn | awk '{printf "%s %s, ", $1, $2}')"
wait "$many_pid" || fail "the 1,000 streams failed: $(cat "$TMP/many.err")"
# Each stream gets the job at once, the 24 node state changes after the 3 s fetch it opened during, and the
# last job event: 26 (fewer only if opening 1,000 streams took longer than that fetch).
messages="$(tail -1 "$TMP/many.out" | jq .messages)"
log "threads: $before before, $following with 1,000 streams open ($names); $messages events delivered"
# A thread per stream would be 1,000 more. Dispatch's own pool may grow by a few dozen on a loaded machine (it
# adds workers when the ones it has look stuck), which is not the streams' doing; 64 leaves room for that.
[ "$following" -le $((before + 64)) ] || fail "threads grew from $before to $following with 1,000 streams"
[ "$messages" -ge $((1000 * 20)) ] || fail "only $messages events reached the 1,000 streams"

step "events of an unknown job: 404; a bad Last-Event-ID: 400"
api GET /v1/jobs/01NOSUCHJOB0000000000000000/events
expect_api_error 404 not_found
api GET "/v1/jobs/$sse/events" "" -H "Last-Event-ID: x1"
expect_api_error 400 bad_request
step "the delivery to the receiver that always fails gave up after --webhook-retry-for"
wait_notify "$always_failing" failed 30
expect_jq .notify.last_status 500
[ "$(jget .notify.attempts)" -ge 3 ] || fail "only $(jget .notify.attempts) attempts within --webhook-retry-for"
api GET /metrics
grep -q 'jobserver_webhook_deliveries_total{outcome="failed"} [1-9]' <<<"$RESP" || fail "no failed delivery counted"
log "ok: events"
