#!/usr/bin/env bash
# Several servers on one PostgreSQL (API.md §10, issue 12), on a throwaway cluster from scripts/pg-cluster.sh:
#  1. three servers: jobs submitted round-robin, each read, long-polled and cancelled through another server
#     than the one it was submitted to; the answers are those of one server;
#  2. chaos: kill -9 one of the three every few seconds (and start it again) while jobs of sequential fetches run;
#     every job that got a 201 settles, no node is fetched again after it settled, and no job has fetches from
#     two processes at once (the fixture upstream records the client process of every fetch);
#     --max-per-host holds over the three servers together (the upstream's most requests at once);
#     --host-rate holds over three more servers together (the upstream's arrival times);
#  3. a server stopped with SIGSTOP for longer than --lease-ttl, then resumed, writes nothing more to the job
#     another server took over (a trigger logs every write with the writing server's application_name), and
#     starts no fetch of it.
# Sizes: SCALEOUT_JOBS (default 300), SCALEOUT_CHAOS_JOBS (default 2000) of SCALEOUT_FETCHES (default 20), each
# fetch answered after SCALEOUT_CHAOS_DELAY_MS (default 20); SCALEOUT_CHAOS_SETTLE_S (default 120) for them to settle.
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

JOBS="${SCALEOUT_JOBS:-300}"
CHAOS_JOBS="${SCALEOUT_CHAOS_JOBS:-2000}"
CHAOS_DELAY_MS="${SCALEOUT_CHAOS_DELAY_MS:-20}"
CHAOS_SETTLE_S="${SCALEOUT_CHAOS_SETTLE_S:-120}"
FETCHES="${SCALEOUT_FETCHES:-20}"
TTL=2s

# Ends the chaos after its round (at most ~28 s: a kill, a wait of 5 s, a restart of 20 s) and waits for it.
stop_chaos() {
  [ -n "${CHAOS_PID:-}" ] || return 0
  touch "$TMP/chaos.stop"
  wait "$CHAOS_PID" 2>/dev/null
  CHAOS_PID=""
}
# The chaos loop ends, and a stopped server goes on, before the servers are stopped.
pg_cleanup_first() {
  local pid
  stop_chaos
  for pid in "${NODE_PIDS[@]+"${NODE_PIDS[@]}"}"; do kill -CONT "$pid" 2>/dev/null; done
}
use_pg_cluster
NODE_PIDS=()
CHAOS_PID=""

step "cluster"
start_pg_cluster
start_upstream

PORTS=()
for n in 0 1 2; do
  start_node "$n" 0 --max-per-host 64 || fail "server $n did not start"
  PORTS+=("$NODE_PORT")
done
node() { echo "http://127.0.0.1:${PORTS[$1]}"; }
log "servers at ${PORTS[*]}"

step "a long-poll on one server wakes when the job settles on another"
# A long-poll on one server wakes when the job changes on another.
api POST "$(node 0)/v1/jobs" "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/1000\"}}"
expect_status 201
polled="$(jget .id)"
began=$SECONDS
api GET "$(node 1)/v1/jobs/$polled?wait=30"
expect_status 200
expect_jq .state succeeded
# Answered before its own wait=30 ran out: woken by the change, not by its timer.
[ $((SECONDS - began)) -lt 30 ] || fail "a long-poll on another server answered only when its wait ran out"

step "an event stream on one server follows the job running on another until it settles"
children=""
for ((f = 0; f < 4; f++)); do
  [ -n "$children" ] && children+=","
  children+="{\"type\":\"fetch\",\"id\":\"s$f\",\"url\":\"$UPSTREAM/delay/300?s=$f\"}"
done
api POST "$(node 0)/v1/jobs" "{\"graph\":{\"type\":\"sequence\",\"children\":[$children]}}"
expect_status 201
streamed="$(jget .id)"
curl -sN --max-time 30 "$(node 2)/v1/jobs/$streamed/events?since=0" >"$TMP/sse.txt" || true
python3 - "$TMP/sse.txt" <<'PY' || fail "the stream on another server was not the job's events: $(head -c 600 "$TMP/sse.txt")"
import json, sys
events, event = [], {}
for line in open(sys.argv[1]).read().split("\n"):
    if line == "":
        if event: events.append(event)
        event = {}
    elif not line.startswith(":") and ":" in line:
        key, _, value = line.partition(":")
        event[key] = value.lstrip(" ")
nodes = [json.loads(e["data"]) for e in events if e.get("event") == "node"]
jobs = [json.loads(e["data"]) for e in events if e.get("event") == "job"]
succeeded = {n["id"] for n in nodes if n["state"] == "succeeded"}
assert jobs and jobs[-1]["state"] == "succeeded", "the stream does not end with the settled job"
assert {"s0", "s1", "s2", "s3"} <= succeeded | {"root"}, "node events missing: %s" % sorted(succeeded)
print("stream on another server: %d events, %d node events, ended with the job %s" % (len(events), len(nodes), jobs[-1]["state"]))
PY

step "an idempotency key is one job over all servers"
body="{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
keyed=()
for n in 0 1 2; do
  curl -sS -o "$TMP/keyed-$n.json" -w '%{http_code}\n' --max-time 10 -X POST -H 'Content-Type: application/json' \
    -H 'Idempotency-Key: scaleout-key-1' --data "$body" "$(node "$n")/v1/jobs" >"$TMP/keyed-$n.code" &
  keyed+=($!)
done
for pid in "${keyed[@]}"; do wait "$pid" || true; done
keyed_ids="$(jq -r .id "$TMP"/keyed-[012].json | sort -u)"
[ "$(echo "$keyed_ids" | wc -l)" = 1 ] || fail "one key made several jobs: $keyed_ids"
[ "$(cat "$TMP"/keyed-[012].code | grep -c 201)" = 1 ] || fail "not exactly one 201: $(cat "$TMP"/keyed-[012].code)"
api POST "$(node 2)/v1/jobs" "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json?other\"}}" -H 'Idempotency-Key: scaleout-key-1'
expect_status 409

step "$JOBS jobs submitted round-robin, each read and cancelled through other servers"
curl -fsS -X POST -o /dev/null "$UPSTREAM/stats/reset"
# Eight requests at a time; each answer is checked against what one server answers.
python3 - "$JOBS" "$UPSTREAM" "$(node 0)" "$(node 1)" "$(node 2)" "$TMP/most.txt" >"$TMP/ids.txt" <<'PY' || fail "an answer differed from one server's (above)"
import json, sys, time, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
jobs, upstream, nodes = int(sys.argv[1]), sys.argv[2], sys.argv[3:6]
sys.path.insert(0, "Tests/Integration")
from scaleout_client import call, wait_upstream
problems = []
def check(what, got, want_status, test):
    status, body = got
    if status not in want_status or not test(body):
        problems.append("%s: %s %s" % (what, status, json.dumps(body)[:300]))
def submit(k):
    got = call("POST", nodes[k % 3] + "/v1/jobs",
               {"graph": {"type": "fetch", "url": upstream + "/delay/60000"}, "metadata": {"k": k}})
    check("submit %d" % k, got, (201,), lambda b: b["state"] in ("pending", "running") and b["metadata"] == {"k": k})
    return got[1].get("id")
def read(k, id):
    check("read %d on another server" % k, call("GET", nodes[(k + 1) % 3] + "/v1/jobs/" + id), (200,),
          lambda b: b["id"] == id and b["metadata"] == {"k": k} and b["state"] in ("pending", "running"))
def cancel(k, id):
    check("cancel %d on a third server" % k, call("POST", nodes[(k + 2) % 3] + "/v1/jobs/" + id + "/cancel"), (202,),
          lambda b: b["id"] == id and b["state"] == "cancelled" and b["error"]["kind"] == "cancelled")
def reread(k, id):
    check("read %d where submitted" % k, call("GET", nodes[k % 3] + "/v1/jobs/" + id), (200,),
          lambda b: b["state"] == "cancelled" and b["progress"]["cancelled"] == 1)
with ThreadPoolExecutor(8) as pool:
    ids = list(pool.map(submit, range(jobs)))
    if problems:
        print("\n".join(problems[:10]), file=sys.stderr); sys.exit(1)
    list(pool.map(read, range(jobs), ids))
    # Before the cancels: a cancelled transfer's request stays counted by the upstream until it sees the
    # disconnect, while the slot it freed already serves another fetch. Once 64 hang there, every slot is taken.
    stats = wait_upstream(upstream, lambda stats: stats["max_active_by_path_prefix"].get("/delay", 0) >= 64, 30)
    if stats is None:
        print("fewer than 64 fetches ever hung upstream at once", file=sys.stderr); sys.exit(1)
    open(sys.argv[6], "w").write(str(stats["max_active_by_path_prefix"]["/delay"]))
    for step in (cancel, reread):
        list(pool.map(step, range(jobs), ids))
if problems:
    print("%d answers differ:\n%s" % (len(problems), "\n".join(problems[:10])), file=sys.stderr)
    sys.exit(1)
print("\n".join(ids))
PY
mapfile -t ids <"$TMP/ids.txt"
[ "${#ids[@]}" = "$JOBS" ] || fail "expected $JOBS ids, got ${#ids[@]}"
# --max-per-host 64 holds over the three servers together: at most 64 of the hanging fetches ran at once.
most="$(cat "$TMP/most.txt")"
log "fetches to the one upstream host at most at once, over three servers with --max-per-host 64: $most"
[ "$most" -le 64 ] || fail "$most fetches ran at once to one host over three servers with --max-per-host 64"
# What one server answers for jobs that are done, through the others: cancel again (200), retry (202) and cancel
# the retried job where it does not run (202), delete (204, then 404 everywhere).
api POST "$(node 1)/v1/jobs/${ids[0]}/cancel"
expect_status 200
expect_jq .state cancelled
api POST "$(node 2)/v1/jobs/${ids[0]}/retry"
expect_status 202
BASE="$(node 0)"
wait_state "${ids[0]}" running
api POST "$(node 1)/v1/jobs/${ids[0]}/cancel"
expect_status 202
wait_settled "${ids[0]}" 30
expect_jq .state cancelled
expect_jq .attempt 2
api DELETE "$(node 0)/v1/jobs/${ids[1]}"
expect_status 204
for n in 0 1 2; do
  api GET "$(node "$n")/v1/jobs/${ids[1]}"
  expect_status 404
done
log "cancelled $JOBS jobs across servers (${SECONDS}s)"

step "--host-rate 127.0.0.1=20/s holds over three servers together"
# Three more servers, each with the same rate; jobs spread over them. Each alone would start 20 a second, so
# together they would reach 60 if the rate held per server.
RATE=20
RATE_FETCHES=60
RATE_PORTS=()
for r in 0 1 2; do
  start_node "r$r" 0 --max-per-host 64 --host-rate "127.0.0.1=$RATE/s" || fail "rate server $r did not start"
  RATE_PORTS+=("$NODE_PORT")
done
curl -fsS -X POST -o /dev/null "$UPSTREAM/stats/reset"
rate_ids=()
started="$(date +%s%N)"
for ((j = 0; j < RATE_FETCHES / 5; j++)); do
  children=""
  for k in 0 1 2 3 4; do children+="${children:+,}{\"type\":\"fetch\",\"url\":\"$UPSTREAM/rate/r$j-$k\"}"; done
  api POST "http://127.0.0.1:${RATE_PORTS[$((j % 3))]}/v1/jobs" "{\"graph\":{\"type\":\"list\",\"children\":[$children]}}"
  expect_status 201
  rate_ids+=("$j $(jget .id)")
done
for entry in "${rate_ids[@]}"; do
  read -r j id <<<"$entry"
  api GET "http://127.0.0.1:${RATE_PORTS[$(((j + 1) % 3))]}/v1/jobs/$id?wait=30"
  expect_status 200
  expect_jq .state succeeded
done
elapsed_ms=$((($(date +%s%N) - started) / 1000000))
curl -fsS "$UPSTREAM/stats" >"$TMP/rate-stats.json"
waited=0
for r in 0 1 2; do
  w="$(curl -fsS "http://127.0.0.1:${RATE_PORTS[$r]}/metrics" | awk '$1 == "jobserver_rate_limited_fetches_total" { print $2 }')"
  awk -v w="${w:-0}" 'BEGIN { exit !(w > 0) }' && waited=$((waited + 1))
  _stop_pid "$(cat "$TMP/node-r$r.pid")" 10
  rm -f "$TMP/node-r$r.pid"
done
python3 - "$TMP/rate-stats.json" "$RATE" "$RATE_FETCHES" "$elapsed_ms" <<'PY' || fail "the rate did not hold over the three servers (above)"
import json, sys
arrivals = sorted(t for v in json.load(open(sys.argv[1]))["arrivals"].values() for t in v)
rate, count, elapsed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) / 1000
# The shortest span of rate + 1 arrivals: at least 1 s if no second held more than `rate` starts.
shortest = min(arrivals[i + rate] - arrivals[i] for i in range(len(arrivals) - rate))
first_to_last = arrivals[-1] - arrivals[0]
print("%d fetches over three servers at %d/s: first to last arrival %.2f s (the rate alone: %.2f s), all done in %.2f s; "
      "the shortest span of %d arrivals %.3f s" % (len(arrivals), rate, first_to_last, (count - 1) / rate, elapsed, rate + 1, shortest))
assert len(arrivals) == count, "the upstream saw %d fetches, not %d" % (len(arrivals), count)
assert shortest >= 1.0, "%d arrivals within %.3f s" % (rate + 1, shortest)
# The servers together keep to the rate, not far below it: 5 % margin, plus a second for start-up and jitter.
assert first_to_last <= (count - 1) / rate * 1.05 + 1.0, "the servers together started far slower than the rate"
PY
[ "$waited" -ge 2 ] || fail "only $waited of the three servers counted fetches held back by the rate in /metrics"

step "chaos: kill -9 one of three servers every 2.5 s while $CHAOS_JOBS jobs of $FETCHES fetches run"
curl -fsS -X POST -o /dev/null "$UPSTREAM/stats/reset"
children=""
for ((f = 0; f < FETCHES; f++)); do
  [ -n "$children" ] && children+=","
  children+="{\"type\":\"fetch\",\"id\":\"f$f\",\"url\":\"$UPSTREAM/span/JOB-$f?pid=jobserver&delay_ms=$CHAOS_DELAY_MS\"}"
done
(
  set +e
  round=0
  # A stop file ends the chaos between rounds, never between a restarted server's start and its pid file (which would
  # leave it running unknown to the cleanup). Not a signal: bash 5.2 loses a trap that fires while it reads a command
  # substitution ("trap: line 2: unexpected EOF while looking for matching `)'"), and the chaos then never ended.
  # Bounded too: at most 400 rounds (about 17 min), and none once this script is gone.
  while [ ! -e "$TMP/chaos.stop" ] && [ "$round" -lt 400 ] && kill -0 "$$" 2>/dev/null; do
    # The chaos's own pace, one kill every 2.5 s: not a wait for an event.
    sleep 2.5
    [ ! -e "$TMP/chaos.stop" ] || break
    n=$((round % 3))
    round=$((round + 1))
    victim="$(cat "$TMP/node-$n.pid")"
    echo "$(date +%s.%N) kill $n" >>"$TMP/chaos.log"
    kill -KILL "$victim" 2>/dev/null
    # Not this subshell's child (but the first time): wait for it to be gone.
    wait_gone "$victim" 5
    echo "$(date +%s.%N) killed $n" >>"$TMP/chaos.log"
    start_node "$n" "${PORTS[$n]}" --max-per-host 64 >>"$TMP/chaos.log" 2>&1 || echo "restart of $n failed" >>"$TMP/chaos.log"
  done
) &
CHAOS_PID=$!
# submit: POST every job (8 at a time, round-robin, a refused or cut connection is no 201); settle: wait for each
# accepted job through any live server and keep its nodes.
chaos_py() {
  python3 - "$@" <<'PY'
import json, sys, time, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
mode, path, nodes = sys.argv[1], sys.argv[2], sys.argv[3:6]
def call(method, url, body=None, timeout=15):
    data = body.encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None
    except (OSError, ValueError):
        return 0, None
if mode == "submit":
    count, template = int(sys.argv[6]), sys.argv[7]
    def submit(k):
        status, body = call("POST", nodes[k % 3] + "/v1/jobs", template.replace("JOB", "c%d" % k))
        return "%s c%d" % (body["id"], k) if status == 201 else None
    with ThreadPoolExecutor(8) as pool:
        accepted = [line for line in pool.map(submit, range(count)) if line]
    open(path, "w").write("".join(line + "\n" for line in accepted))
    print(len(accepted))
else:
    deadline = time.time() + float(sys.argv[6])
    def settle(line):
        id, key = line.split()
        for i in range(1000):
            if time.time() > deadline:
                return "job %s not settled in time" % id
            status, job = call("GET", nodes[i % 3] + "/v1/jobs/" + id + "?wait=5")
            if status == 200 and job["state"] in ("succeeded", "failed", "cancelled", "skipped"):
                if job["state"] != "succeeded":
                    return "job %s ended %s: %s" % (id, job["state"], json.dumps(job.get("error")))
                status, listing = call("GET", nodes[i % 3] + "/v1/jobs/" + id + "/nodes")
                if status == 200:
                    return {"key": key, "nodes": [{k: n[k] for k in ("id", "state", "finished_at")} for n in listing["nodes"]]}
        return "job %s: no answer" % id
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(settle, open(path).read().split("\n")[:-1]))
    failures = [r for r in results if isinstance(r, str)]
    if failures:
        print("\n".join(failures[:10]), file=sys.stderr)
        sys.exit(1)
    with open(path + ".nodes", "w") as out:
        for r in results:
            out.write(json.dumps(r) + "\n")
PY
}
template="{\"graph\":{\"type\":\"sequence\",\"children\":[$children]}}"
accepted="$(chaos_py submit "$TMP/accepted.txt" "$(node 0)" "$(node 1)" "$(node 2)" "$CHAOS_JOBS" "$template")"
log "$accepted of $CHAOS_JOBS submissions answered 201 (${SECONDS}s)"
# Through six kills in all and one more after the last submission, however fast the machine is, while the jobs run
# (for 30 s at most).
kills_at_submit="$(grep -cE ' killed [0-9]+$' "$TMP/chaos.log" 2>/dev/null)" || kills_at_submit=0
next_line "$TMP/chaos.log" 0 30 "$CHAOS_PID" ' killed [0-9]+$' $((kills_at_submit < 6 ? 6 : kills_at_submit + 1)) >/dev/null || true
stop_chaos
log "kills: $(grep -cE ' killed [0-9]+$' "$TMP/chaos.log") (${SECONDS}s)"
for n in 0 1 2; do
  kill -0 "$(cat "$TMP/node-$n.pid")" 2>/dev/null || start_node "$n" "${PORTS[$n]}" --max-per-host 64 || fail "server $n did not start again"
done
chaos_py settle "$TMP/accepted.txt" "$(node 0)" "$(node 1)" "$(node 2)" "$CHAOS_SETTLE_S" || fail "not every accepted job succeeded (above)"
log "every accepted job settled (${SECONDS}s)"
cp "$TMP/accepted.txt.nodes" "$TMP/nodes.jsonl"
curl -fsS "$UPSTREAM/stats" >"$TMP/stats.json"
python3 - "$TMP/nodes.jsonl" "$TMP/stats.json" "$FETCHES" "$CHAOS_DELAY_MS" "$TMP/chaos.log" <<'PY' || fail "the chaos run broke a promise (above)"
import json, sys
from datetime import datetime
jobs = [json.loads(line) for line in open(sys.argv[1])]
spans = json.load(open(sys.argv[2]))["spans"]
fetches, delay = int(sys.argv[3]), int(sys.argv[4]) / 1000
# Each kill: when it was sent and when the server was seen gone.
kills, sent = [], None
for line in open(sys.argv[5]):
    words = line.split()
    if len(words) == 3 and words[1] == "kill":
        sent = float(words[0])
    elif len(words) == 3 and words[1] == "killed" and sent is not None:
        kills.append((sent, float(words[0])))
        sent = None
if sent is not None:
    kills.append((sent, sent + 5))
def epoch(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
refetched, overlaps, total, extra, unknown = [], [], 0, 0, 0
for job in jobs:
    mine = []
    for node in job["nodes"]:
        if not node["id"].startswith("f"):
            continue
        key = "%s-%s" % (job["key"], node["id"][1:])
        seen = spans.get(key, [])
        total += len(seen)
        extra += max(0, len(seen) - 1)
        settled = epoch(node["finished_at"])
        # A fetch that began after its node had settled (stored results are never fetched again).
        refetched += [key for s in seen if s["start"] > settled + 0.001]
        mine += seen
    mine.sort(key=lambda s: s["start"])
    for i, s in enumerate(mine):
        if s.get("pid") is None:
            # The client was gone before the upstream found it in /proc: only a server killed mid-request. The
            # answer may still have been written to the dead client's socket, but then during a kill.
            if s["end"] is not None and not any(a - 0.05 <= s["end"] <= b + 0.5 for a, b in kills):
                print("an answered fetch of %s has no client pid recorded, and no server was being killed" % job["key"])
                sys.exit(1)
            s["pid"] = "gone-%d" % i
            unknown += 1
    for a, b in zip(mine, mine[1:]):
        # A fetch left unanswered (its server died) counts as running for its delay.
        end = a["end"] if a["end"] is not None else a["start"] + delay
        if b["start"] < end and a.get("pid") != b.get("pid"):
            overlaps.append((job["key"], a.get("pid"), b.get("pid")))
print("jobs %d, fetches %d (%d again after an interrupted attempt; %d cut off by a kill before their client was found), "
      "fetched after settling %d, on two servers at once %d" % (len(jobs), total, extra, unknown, len(refetched), len(overlaps)))
if refetched or overlaps:
    print("refetched:", refetched[:5], "overlaps:", overlaps[:5])
    sys.exit(1)
PY

step "SIGSTOP past --lease-ttl: the stopped server writes nothing to the job another server took over"
psql_ "CREATE TABLE scaleout_writes (at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), tbl TEXT, job_id TEXT, app TEXT);
CREATE FUNCTION scaleout_log_job() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN
  INSERT INTO scaleout_writes (tbl, job_id, app) VALUES (TG_TABLE_NAME, NEW.id, current_setting('application_name'));
  RETURN NULL; END \$\$;
CREATE FUNCTION scaleout_log_part() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN
  INSERT INTO scaleout_writes (tbl, job_id, app) VALUES (TG_TABLE_NAME, NEW.job_id, current_setting('application_name'));
  RETURN NULL; END \$\$;
CREATE TRIGGER scaleout_jobs AFTER UPDATE OF state, version, p_succeeded, result ON jobs FOR EACH ROW EXECUTE FUNCTION scaleout_log_job();
CREATE TRIGGER scaleout_nodes AFTER UPDATE ON nodes FOR EACH ROW EXECUTE FUNCTION scaleout_log_part();
CREATE TRIGGER scaleout_bodies AFTER INSERT OR UPDATE ON bodies FOR EACH ROW EXECUTE FUNCTION scaleout_log_part();" \
  || fail "could not install the write log"
children=""
for ((f = 0; f < 12; f++)); do
  [ -n "$children" ] && children+=","
  children+="{\"type\":\"fetch\",\"id\":\"f$f\",\"url\":\"$UPSTREAM/span/stop-$f?pid=jobserver&delay_ms=400\"}"
done
api POST "$(node 0)/v1/jobs" "{\"graph\":{\"type\":\"sequence\",\"children\":[$children]}}"
expect_status 201
stopped_id="$(jget .id)"
stopped_pid="$(cat "$TMP/node-0.pid")"
NODE_PIDS+=("$stopped_pid")
BASE="$(node 1)"
# Stopped with two of its fetches done.
wait_nodes_state "$stopped_id" succeeded f1
kill -STOP "$stopped_pid"
stop_at="$(date +%s.%N)"
# Stopped until another server has taken the job over, past --lease-ttl, and written to it; the job's versions,
# followed through server 1, move as it goes on there.
fetch_job "$stopped_id"
deadline=$((SECONDS + 30))
for ((i = 0; i < 3000; i++)); do
  version="$(jget .version)"
  [ "$(psql_ "SELECT count(*) FROM scaleout_writes WHERE job_id = '$stopped_id' AND app <> 'server-0'")" -gt 0 ] && break
  [ "$SECONDS" -lt "$deadline" ] || fail "no other server wrote the job within 30 s of the stop: it was not taken over"
  api GET "/v1/jobs/$stopped_id?wait=$(poll_seconds "$deadline")&since=$version"
  expect_status 200
done
cont_from="$(file_size "$TMP/node-0.log")"
kill -CONT "$stopped_pid"
cont_at="$(date +%s.%N)"
wait_settled "$stopped_id" 40
expect_jq .state succeeded
# Once resumed, the server finds its lease lost and drops the job: what it wrote or fetched until then is checked.
next_line "$TMP/node-0.log" "$cont_from" 30 "$stopped_pid" "lease lost.*\"job\":\"$stopped_id\"" >/dev/null \
  || fail "the resumed server did not drop the job: $(tail -5 "$TMP/node-0.log")"
taken="$(psql_ "SELECT min(at) FROM scaleout_writes WHERE job_id = '$stopped_id' AND app <> 'server-0'")"
[ -n "$taken" ] || fail "no other server wrote the job: it was not taken over"
late="$(psql_ "SELECT count(*) FROM scaleout_writes WHERE job_id = '$stopped_id' AND app = 'server-0' AND at >= '$taken'")"
[ "$late" = 0 ] || fail "the stopped server wrote $late rows of the job after another server took it over"
curl -fsS "$UPSTREAM/stats" >"$TMP/stats.json"
python3 - "$TMP/stats.json" "$stopped_pid" "$cont_at" <<'PY' || fail "the resumed server fetched for the job it lost"
import json, sys
spans = json.load(open(sys.argv[1]))["spans"]
pid, cont = int(sys.argv[2]), float(sys.argv[3])
late = [k for k, v in spans.items() if k.startswith("stop-") for s in v if s.get("pid") == pid and s["start"] > cont]
others = sum(1 for k, v in spans.items() if k.startswith("stop-") for s in v if s.get("pid") != pid)
print("fetches by the resumed server after SIGCONT: %d; by the server that took over: %d" % (len(late), others))
sys.exit(1 if late or others == 0 else 0)
PY
log "stopped at $stop_at, resumed at $cont_at; takeover write at $taken; the stopped server wrote nothing after it"
log "ok in ${SECONDS}s"
