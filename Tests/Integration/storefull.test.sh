#!/usr/bin/env bash
# The store-failure policy (API.md §3, docs/store.md): with the store on a
# small tmpfs that a filler file fills up while 8 clients submit, clients see
# only 2xx, 429 and 503 (storage_unavailable, with Retry-After), /healthz says
# degraded and /metrics counts the failures; once space returns, without a
# restart, health is ok again and every job that got a 201 settles, in memory
# and on disk; after kill -9 and a restart each reads back the same.
#
# Needs root to mount the tmpfs (CI runs as root); otherwise it is
# skipped with the reason printed. Variables:
#   STORE_FULL_SECONDS   how long the disk stays full (default 5)
#   STORE_TMPFS_SIZE     size of the tmpfs (default 32m: room for what the load writes before and after)
#   STORE_CLIENTS        submitting clients (default 8)
#   STORE_AFTER_SECONDS  how long the load goes on once space returns (default 6,
#                        past the store's longest retry delay of 5 s)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"

full_s="${STORE_FULL_SECONDS:-5}"
tmpfs_size="${STORE_TMPFS_SIZE:-32m}"
clients="${STORE_CLIENTS:-8}"
after_s="${STORE_AFTER_SECONDS:-6}"

start_upstream

# ------------------------------------------------------------ disk full
if [ "$(id -u)" != 0 ]; then
  log "SKIP: mounting a tmpfs needs root (running as uid $(id -u))"
  exit 0
fi
mnt="$TMP/store"
mkdir -p "$mnt"
if ! mount -t tmpfs -o "size=$tmpfs_size" tmpfs "$mnt" 2>"$TMP/mount.err"; then
  log "SKIP disk-full part: cannot mount a tmpfs: $(cat "$TMP/mount.err")"
  exit 0
fi
# The server must be gone before the unmount, and the unmount before lib.sh removes $TMP.
_unmount_store() {
  local rc=$? pid
  for pid in "${STARTED_PIDS[@]+"${STARTED_PIDS[@]}"}"; do _stop_pid "$pid" 5; done
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  (exit "$rc")
  _cleanup
}
trap _unmount_store EXIT

db="$mnt/jobs.sqlite"
start_server_on "$db"
log "store on a $tmpfs_size tmpfs, $clients clients, disk full for ${full_s}s"

# Each client submits jobs in a loop (a list of two fetches, one slow), cancels
# every fifth one it got, reads its job back, lists now and then, and honours
# Retry-After (at most 0.2 s here, to keep the load on). It prints `going` once
# its first job is accepted, and writes every status it saw, and the id of
# every 201, until $TMP/stop exists.
cat >"$TMP/load.py" <<'PY'
import http.client, json, os, sys, threading, time
port, upstream, clients, out_dir = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
stop = os.path.join(out_dir, "stop")
lock = threading.Lock()
statuses, created, unexpected = {}, [], []

def client(n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    i = 0
    def call(method, path, body=None):
        nonlocal conn
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in range(3):
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                return r.status, r.getheader("Retry-After"), data
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                err = e
        return 0, None, str(err).encode()
    going = False
    while not os.path.exists(stop) and i < 100000:
        i += 1
        body = json.dumps({"name": f"c{n}-{i}", "graph": {"type": "list", "children": [
            {"id": "quick", "type": "fetch", "url": upstream + "/json?size=512"},
            {"id": "slow", "type": "fetch", "url": upstream + "/delay/300"}]}})
        status, retry, data = call("POST", "/v1/jobs", body)
        seen = [status]
        if status == 201:
            job = json.loads(data)["id"]
            with lock:
                created.append(job)
                if not going:
                    going = True
                    sys.stdout.write("going\n")
                    sys.stdout.flush()
            if i % 5 == 0:
                seen.append(call("POST", f"/v1/jobs/{job}/cancel")[0])
            seen.append(call("GET", f"/v1/jobs/{job}")[0])
        if i % 10 == 0:
            seen.append(call("GET", "/v1/jobs?limit=5")[0])
        with lock:
            for s in seen:
                statuses[s] = statuses.get(s, 0) + 1
                if s not in (200, 201, 202, 429, 503):
                    unexpected.append(s)
            if status == 503 and retry is None:
                unexpected.append("503 without Retry-After")
            if status == 503 and json.loads(data)["error"]["code"] not in ("storage_unavailable",):
                unexpected.append("503 " + data.decode()[:200])
        # The pace of the load (Retry-After honoured, capped to keep the load on), not a wait for an event.
        if status in (429, 503):
            time.sleep(min(float(retry or 1), 0.2))
        else:
            time.sleep(0.01)

threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
json.dump({"statuses": {str(k): v for k, v in statuses.items()}, "created": created, "unexpected": unexpected},
          open(os.path.join(out_dir, "load.json"), "w"))
PY

# keep_full.py MOUNT FILLER SECONDS: for SECONDS, gives the space anything frees on MOUNT to FILLER (a file there)
# as soon as it is freed: woken by inotify on the folder (a write, a truncation, a deletion), not by a clock.
cat >"$TMP/keep_full.py" <<'PY'
import ctypes, errno, os, select, struct, sys, time
mount, filler_name, seconds = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
end = time.monotonic() + seconds
libc = ctypes.CDLL(None, use_errno=True)
IN_MODIFY, IN_MOVED_FROM, IN_DELETE = 0x2, 0x40, 0x200
watch = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
if watch < 0 or libc.inotify_add_watch(watch, mount.encode(), IN_MODIFY | IN_MOVED_FROM | IN_DELETE) < 0:
    sys.exit("inotify: " + os.strerror(ctypes.get_errno()))
filler = os.open(os.path.join(mount.encode(), filler_name), os.O_WRONLY | os.O_APPEND)
block = bytes(4096)

def fill():
    try:
        while os.write(filler, block) > 0:
            pass
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise

fill()
while (left := end - time.monotonic()) > 0:
    if not select.select([watch], [], [], left)[0]:
        continue
    events, at, others = os.read(watch, 65536), 0, False
    while at < len(events):
        _, _, _, length = struct.unpack_from("iIII", events, at)
        # The filler's own growth frees nothing.
        others |= events[at + 16:at + 16 + length].rstrip(b"\0") != filler_name
        at += 16 + length
    if others:
        fill()
PY

health_code() { curl -s -o "$TMP/health.body" -w '%{http_code}' --max-time 5 "$BASE/healthz" || true; }
metric() { curl -s --max-time 5 "$BASE/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

step "load from $clients clients"
python3 "$TMP/load.py" "$SERVER_PORT" "$UPSTREAM" "$clients" "$TMP" >"$TMP/load.out" 2>"$TMP/load.err" &
load_pid=$!
STARTED_PIDS+=("$load_pid")
next_line "$TMP/load.out" 0 30 "$load_pid" '^going$' "$clients" >/dev/null \
  || fail "not every load client had a job accepted within 30 s: $(tail -5 "$TMP/load.err")"

step "fill the disk for ${full_s}s"
dd if=/dev/zero of="$mnt/filler" bs=64k 2>/dev/null || true
log "filler $(du -h "$mnt/filler" | cut -f1), free: $(df --output=avail -h "$mnt" | tail -1)"
# Keep the disk full: space the store frees (a checkpoint) goes to the filler.
python3 "$TMP/keep_full.py" "$mnt" filler "$full_s" 2>"$TMP/keep_full.err" &
keeper_pid=$!
STARTED_PIDS+=("$keeper_pid")
saw_degraded=0
metric_agreed=0
# degraded_seen: looks at /healthz (and /metrics); true once both have said degraded.
degraded_seen() {
  if [ "$(health_code)" = 503 ] && [ "$(jq -r .status "$TMP/health.body" 2>/dev/null)" = degraded ]; then
    if [ "$saw_degraded" = 0 ]; then
      log "healthz: $(cat "$TMP/health.body"); store_degraded=$(metric jobserver_store_degraded)"
    fi
    saw_degraded=1
    # Two requests, not one snapshot: a write that fits in the space left may commit between them and clear the
    # state, so /metrics must agree with a degraded /healthz at least once while the disk is full.
    [ "$metric_agreed" = 1 ] || { [ "$(metric jobserver_store_degraded)" = 1 ] && metric_agreed=1; }
  fi
  [ "$saw_degraded" = 1 ] && [ "$metric_agreed" = 1 ]
}
# Looked at again each time the server logs that the store degraded, or refuses a submission with 503.
until_logged 'store writes are failing|"path":"/v1/jobs","status":503' "$full_s" degraded_seen || true
# The disk stays full until the keeper ends, $full_s s after it began: the window under test, not a wait.
wait "$keeper_pid" || fail "keeping the disk full failed: $(cat "$TMP/keep_full.err")"
[ "$saw_degraded" = 1 ] || fail "/healthz never said degraded while the disk was full"
[ "$metric_agreed" = 1 ] || fail "/healthz degraded but jobserver_store_degraded was never 1 while the disk was full"
failures="$(metric jobserver_store_write_failures_total)"
[ "${failures:-0}" -ge 1 ] || fail "jobserver_store_write_failures_total is ${failures:-missing}"

step "space returns; load goes on for ${after_s}s"
from="$(file_size "$SERVER_LOG")"
rm -f "$mnt/filler"
freed_ms="$(millis)"
healthy_after=""
healthy() { [ "$(health_code)" = 200 ]; }
if healthy || { next_line "$SERVER_LOG" "$from" "$after_s" "$SERVER_PID" 'store writes recovered' >/dev/null && healthy; }; then
  healthy_after=$(($(millis) - freed_ms))
fi
log "under load, /healthz was 200 again ${healthy_after:-(not yet)} ms after space returned"
# The load goes on for $after_s s after space returned: the window under test, not a wait.
sleep "$(awk -v ms=$((after_s * 1000 - ($(millis) - freed_ms))) 'BEGIN { print (ms > 0 ? ms / 1000 : 0) }')"
touch "$TMP/stop"
wait_gone "$load_pid" 60 || fail "load clients did not stop within 60 s"
wait "$load_pid" || fail "load clients failed: $(tail -5 "$TMP/load.err")"
load="$(cat "$TMP/load.json")"
log "statuses seen: $(jq -c .statuses <<<"$load"), jobs created: $(jq '.created | length' <<<"$load")"
[ "$(jq '.unexpected | length' <<<"$load")" = 0 ] || fail "unexpected answers: $(jq -c '.unexpected[:10]' <<<"$load")"
[ "$(jq '.statuses["503"] // 0' <<<"$load")" -ge 1 ] || fail "no client was refused with 503 while the disk was full"
jq -r '.created[]' <<<"$load" >"$TMP/created"
created="$(wc -l <"$TMP/created")"
[ "$created" -ge 1 ] || fail "no job was created"

step "health returns to ok without a restart"
until_logged 'store writes recovered' 30 healthy \
  || fail "/healthz still $(health_code) 30 s after space returned: $(cat "$TMP/health.body")"
log "write failures counted: $(metric jobserver_store_write_failures_total)"
[ "$(metric jobserver_store_degraded)" = 0 ] || fail "jobserver_store_degraded is not 0 after recovery"
submit "{\"name\":\"after\",\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
echo "$JOB_ID" >>"$TMP/created"
created=$((created + 1))

# read_jobs MODE: for every id in $TMP/created, long-polls (MODE=settle) or reads
# (MODE=read) the job and prints "id state version"; exits 1 if one is missing or
# (settle) not settled within 60 s in all.
read_jobs() {
  python3 - "$SERVER_PORT" "$1" "$TMP/created" <<'PY'
import http.client, json, sys, time
port, mode, ids = int(sys.argv[1]), sys.argv[2], open(sys.argv[3]).read().split()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
deadline = time.monotonic() + 60
settled = {"succeeded", "failed", "cancelled", "skipped"}
for job in ids:
    for _ in range(100):
        conn.request("GET", f"/v1/jobs/{job}" + ("?wait=5" if mode == "settle" else ""))
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            sys.exit(f"GET {job}: {r.status} {data[:200]!r}")
        record = json.loads(data)
        if mode == "read" or record["state"] in settled or time.monotonic() > deadline:
            break
    if mode == "settle" and record["state"] not in settled:
        sys.exit(f"job {job} not settled within 60 s: {record['state']}")
    print(job, record["state"], record["version"])
PY
}

step "every one of the $created acknowledged jobs settles"
read_jobs settle >"$TMP/settled" || fail "not every acknowledged job settled"

step "and is stored settled: nothing left pending or running in the file"
# A node's response body is read from the store: it is answered once the store committed everything handed to it
# before, the settled states above among them.
api GET "/v1/jobs/$JOB_ID/nodes/root/body"
expect_status 200
python3 - "$db" "$TMP/settled" >"$TMP/db.check" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
bad = []
for line in open(sys.argv[2]):
    job, state, version = line.split()
    row = db.execute("SELECT state, version FROM jobs WHERE id = ?", (job,)).fetchone()
    if row is None or row[0] != state or str(row[1]) != version:
        bad.append(f"{job}: memory {state} v{version}, file {row}")
left = db.execute("SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')").fetchone()[0]
nodes = db.execute("SELECT count(*) FROM nodes n JOIN jobs j ON j.id = n.job_id WHERE n.state IN ('pending', 'running') "
                   "AND j.state NOT IN ('pending', 'running')").fetchone()[0]
if left: bad.append(f"{left} jobs pending or running")
if nodes: bad.append(f"{nodes} unsettled nodes in settled jobs")
if bad: print("\n".join(bad[:10]))
PY
[ -s "$TMP/db.check" ] && fail "the file disagrees with the API once the store committed: $(cat "$TMP/db.check")"

step "kill -9, restart: every job reads back the same"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
start_server_on "$db"
read_jobs read >"$TMP/reread" || fail "a job could not be read after the restart"
diff "$TMP/settled" "$TMP/reread" >"$TMP/reread.diff" || fail "jobs read back differently after the restart: $(head -5 "$TMP/reread.diff")"
log "ok: $created jobs acknowledged, all settled and stored through ${full_s}s of full disk"
