#!/usr/bin/env bash
# Several servers on one PostgreSQL (API.md §10) against one server on SQLite, in the same run, same flags:
# completed 10-node jobs per second (a list of nine loopback fetches) with 1, 2 and 3 servers on one PostgreSQL
# database and with one server on SQLite; CLIENTS clients, spread round-robin over the servers, each submit a job
# and long-poll it until it settles, for COMPLETE_SECONDS. Also per-server CPU (% of one core), PostgreSQL's CPU
# and its commits per second (pg_stat_database.xact_commit) over the same time, and the rate N servers would
# reach if they scaled linearly from one. The cross-server limits: 3 servers again with a --host-rate that never
# binds (every fetch start books its time in host_rates), and a micro-measure (pgbench, one connection, prepared, for
# MICRO_SECONDS each) of the statements a fetch start costs on PostgreSQL: a --max-per-host slot taken and given
# back (two advisory-lock statements) and a --host-rate booking (one INSERT … ON CONFLICT), against SELECT 1.
# PostgreSQL is a throwaway cluster (scripts/pg-cluster.sh) with fsync on, on the same cores as the servers and
# the load generator. SCALEOUT_RUNS (default 5) runs, each measuring every configuration once; the section gives
# the median (min–max) of each figure. Prints a markdown section on stdout; progress goes to stderr.
# JOBSERVER_BIN runs that binary instead of building the release one (the section then says which).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

COMPLETE_SECONDS=${COMPLETE_SECONDS:-15}
CLIENTS=${CLIENTS:-24}
RUNS=${SCALEOUT_RUNS:-5}
MICRO_SECONDS=${MICRO_SECONDS:-10}

if [ -n "${JOBSERVER_BIN:-}" ]; then
    BIN=$JOBSERVER_BIN
else
    swift build -c release --product jobserver >&2
    BIN=$(swift build -c release --show-bin-path)/jobserver
fi
build=$(case "$BIN" in */release/*) echo release ;; */debug/*) echo debug ;; *) echo "$BIN" ;; esac)

bench_setup
start_postgres

start_upstream
python3 - "$tmp/run.json" "$up_port" <<'PY'
import json, sys
run = [{"type": "fetch", "url": "http://127.0.0.1:%s/json?step=%d" % (sys.argv[2], i)} for i in range(9)]
json.dump({"graph": {"type": "list", "children": run}}, open(sys.argv[1], "w"))
PY

# Clock ticks of user and system time of one process, or of every process named postgres.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
pg_ticks() {
    local total=0 p
    for p in $(pgrep -x postgres); do total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
    echo "$total"
}
hz=$(getconf CLK_TCK)
commits() { psql "$url" -qAtc "SELECT sum(xact_commit) FROM pg_stat_database"; }

# complete SECONDS PORT…: "jobs/s failed" for CLIENTS clients spread over the servers on PORT….
complete() {
    python3 - "$CLIENTS" "$tmp/run.json" "$@" <<'PY'
import json, sys, threading, time, urllib.request
clients, body, seconds, ports = int(sys.argv[1]), open(sys.argv[2], "rb").read(), float(sys.argv[3]), sys.argv[4:]
done, failed, lock = [0], [0], threading.Lock()
end = time.monotonic() + seconds
def client(k):
    base = "http://127.0.0.1:%s" % ports[k % len(ports)]
    while time.monotonic() < end:
        try:
            req = urllib.request.Request(base + "/v1/jobs", data=body, headers={"Content-Type": "application/json"})
            job = json.load(urllib.request.urlopen(req, timeout=30))
            for _ in range(100):
                if job["state"] not in ("pending", "running"):
                    break
                job = json.load(urllib.request.urlopen(
                    "%s/v1/jobs/%s?wait=10&since=%d" % (base, job["id"], job["version"]), timeout=30))
            ok = job["state"] == "succeeded"
        except OSError:
            ok = False
        with lock:
            if ok: done[0] += 1
            else: failed[0] += 1
start = time.monotonic()
threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print("%.1f %d" % (done[0] / (time.monotonic() - start), failed[0]))
PY
}

load=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A rate failed cpu pgcpu pgcommits
configs=(sqlite pg1 pg2 pg3 pg3rate)
# Each run measures every configuration once, in turn, on fresh databases; every figure is kept per run.
for run in $(seq 1 "$RUNS"); do
for config in "${configs[@]}"; do
    servers=1
    if [ "$config" = sqlite ]; then
        db="$tmp/$config-$run.sqlite"
    else
        servers=${config#pg}
        servers=${servers%rate}
        psql "$url" -qAtc "CREATE DATABASE ${config}_$run" >/dev/null
        db="${url%/*}/${config}_$run"
    fi
    ports=()
    spids=()
    extra=()
    # A rate no start waits for: the cost is the booking alone.
    [ "$config" = pg3rate ] && extra=(--host-rate '127.0.0.1=1000000/s')
    for ((n = 0; n < servers; n++)); do
        port=$(free_port)
        "$BIN" serve --host 127.0.0.1 --port "$port" --db "$db" --max-active-jobs 1000000 \
            --max-per-host 4096 "${extra[@]+"${extra[@]}"}" 2>>"$tmp/server.log" &
        pids+=($!)
        spids+=($!)
        ports+=("$port")
        wait_for "http://127.0.0.1:$port/healthz"
    done
    declare -a before=()
    for ((n = 0; n < servers; n++)); do before[n]=$(ticks "${spids[n]}"); done
    pg_before=$(pg_ticks)
    commits_before=$(commits)
    started=$(date +%s.%N)
    read -r rate[$config] failed[$config] < <(complete "$COMPLETE_SECONDS" "${ports[@]}")
    elapsed=$(python3 -c "import time; print(time.time() - $started)")
    commits_after=$(commits)
    pg_after=$(pg_ticks)
    shares=()
    for ((n = 0; n < servers; n++)); do
        shares+=("$(python3 -c "print(round(100 * ($(ticks "${spids[n]}") - ${before[n]}) / $hz / $elapsed))")")
    done
    joined=$(printf '%s / ' "${shares[@]}")
    cpu[$config]=${joined% / }
    if [ "$config" = sqlite ]; then
        pgcpu[$config]="–"
        pgcommits[$config]="–"
    else
        pgcpu[$config]=$(python3 -c "print(round(100 * ($pg_after - $pg_before) / $hz / $elapsed))")
        pgcommits[$config]=$(python3 -c "print(round(($commits_after - $commits_before) / $elapsed))")
    fi
    for p in "${spids[@]}"; do kill -TERM "$p"; done
    for p in "${spids[@]}"; do wait "$p" 2>/dev/null || true; done
    echo "run $run, $config: ${rate[$config]} jobs/s, cpu ${cpu[$config]} %, pg cpu ${pgcpu[$config]} %, commits/s ${pgcommits[$config]}" >&2
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$config" "${rate[$config]}" "${failed[$config]}" "${cpu[$config]}" \
        "${pgcpu[$config]}" "${pgcommits[$config]}" >>"$tmp/runs.tsv"
done
done
# The median (min–max) over the runs of each figure; CPU per server as the median of each server's share.
summary() {
    python3 - "$tmp/runs.tsv" "$1" "$2" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
config, field = sys.argv[2], sys.argv[3]
mine = [r for r in rows if r[0] == config]
def span(xs, fmt):
    xs = sorted(xs)
    return (fmt % statistics.median(xs)) + " (" + (fmt % xs[0]) + "–" + (fmt % xs[-1]) + ")"
if field == "rate":
    print(span([float(r[1]) for r in mine], "%.1f"))
elif field == "failed":
    print(sum(int(r[2]) for r in mine))
elif field == "cpu":
    shares = [[float(x) for x in r[3].split(" / ")] for r in mine]
    print(" / ".join("%d" % statistics.median(s[k] for s in shares) for k in range(len(shares[0]))))
elif field in ("pgcpu", "commits"):
    column = 4 if field == "pgcpu" else 5
    print("–" if mine[0][column] == "–" else span([float(r[column]) for r in mine], "%d"))
elif field == "linear":
    one = statistics.median(float(r[1]) for r in rows if r[0] == "pg1")
    print("%.1f" % (one * int(config[2:3])))
PY
}
for config in "${configs[@]}"; do
    rate[$config]=$(summary "$config" rate)
    failed[$config]=$(summary "$config" failed)
    cpu[$config]=$(summary "$config" cpu)
    pgcpu[$config]=$(summary "$config" pgcpu)
    pgcommits[$config]=$(summary "$config" commits)
done
linear() { summary "pg$1" linear; }

# micro NAME SQL…: "µs-per-transaction transactions/s" of a pgbench script of the statements, one connection.
micro_db="${url%/*}/pg1_1"
micro() {
    local name="$1" out
    shift
    printf '%s\n' "$@" >"$tmp/micro-$name.sql"
    out=$(pgbench -n -M prepared -c 1 -T "$MICRO_SECONDS" -f "$tmp/micro-$name.sql" "$micro_db" 2>&1) \
        || { echo "pgbench $name failed: $out" >&2; echo "– –"; return; }
    python3 - "$out" <<'PY'
import re, sys
text = sys.argv[1]
latency = float(re.search(r"latency average = ([0-9.]+) ms", text).group(1)) * 1000
tps = float(re.search(r"tps = ([0-9.]+)", text).group(1))
print("%.0f %.0f" % (latency, tps))
PY
}
read -r us_select tps_select < <(micro select "SELECT 1;")
read -r us_slot tps_slot < <(micro slot \
    "SELECT s FROM generate_series(0, 63) AS s WHERE CASE WHEN s = ANY('{}'::int[]) THEN false ELSE pg_try_advisory_lock(76, s) END LIMIT 1;" \
    "SELECT pg_advisory_unlock(76, 0);")
now_us="(extract(epoch FROM statement_timestamp()) * 1000000)::bigint"
read -r us_rate tps_rate < <(micro rate \
    "INSERT INTO host_rates AS r (host, next_start_us) VALUES ('bench', $now_us + 1) ON CONFLICT (host) DO UPDATE SET next_start_us = GREATEST(r.next_start_us, $now_us) + 1 RETURNING r.next_start_us - 1 - $now_us;")
echo "micro: SELECT 1 $us_select µs, slot $us_slot µs, rate $us_rate µs" >&2

cat <<MD
## Several servers on one PostgreSQL

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

\`bench/76-scaleout.sh\`: the $build server, one on SQLite and 1, 2 and 3 on one database of a throwaway
PostgreSQL cluster (fsync on, default \`--lease-ttl\`), one configuration after the other with the same flags
(\`--max-per-host 4096\`). $CLIENTS clients, spread round-robin over the servers, each submit a job of nine loopback
fetches under a list (ten nodes) and long-poll it until it settles, for ${COMPLETE_SECONDS} s; $RUNS runs, each measuring every configuration in
turn. Figures are the median (min–max) over the runs; jobs not succeeded are summed over them. CPU is user +
system time over the measurement, in % of one core, per server (the median of each server's share) and for all of
PostgreSQL's processes; commits are PostgreSQL's over the same time.
Load average when the run began: $load.

| configuration | completed 10-node jobs / s | linear from 1 server | jobs not succeeded | server CPU % | PostgreSQL CPU % | PostgreSQL commits / s |
|---|---|---|---|---|---|---|
| SQLite, 1 server | ${rate[sqlite]} | – | ${failed[sqlite]} | ${cpu[sqlite]} | ${pgcpu[sqlite]} | ${pgcommits[sqlite]} |
| PostgreSQL, 1 server | ${rate[pg1]} | $(linear 1) | ${failed[pg1]} | ${cpu[pg1]} | ${pgcpu[pg1]} | ${pgcommits[pg1]} |
| PostgreSQL, 2 servers | ${rate[pg2]} | $(linear 2) | ${failed[pg2]} | ${cpu[pg2]} | ${pgcpu[pg2]} | ${pgcommits[pg2]} |
| PostgreSQL, 3 servers | ${rate[pg3]} | $(linear 3) | ${failed[pg3]} | ${cpu[pg3]} | ${pgcpu[pg3]} | ${pgcommits[pg3]} |
| PostgreSQL, 3 servers, \`--host-rate\` booked | ${rate[pg3rate]} | – | ${failed[pg3rate]} | ${cpu[pg3rate]} | ${pgcpu[pg3rate]} | ${pgcommits[pg3rate]} |

All of it shares $(nproc) cores: the servers, PostgreSQL, the fixture upstream and the load generator, so more
servers cannot add CPU, only spread it; "linear from 1 server" is what N servers would complete if each added
what one does. Each server's writer commits its own batches, so more servers mean more, smaller commits.
Every PostgreSQL configuration takes a cross-server \`--max-per-host\` slot per fetch start (advisory locks); the
last row also books each start in \`host_rates\` for a rate of 1,000,000/s per host, which no start waits for.

What a fetch start costs on PostgreSQL, per statement on one connection (pgbench, prepared, ${MICRO_SECONDS} s each,
the same cluster, no other load), against a bare round trip:

| statement(s) | µs per round | rounds / s on one connection |
|---|---|---|
| \`SELECT 1\` (a round trip) | $us_select | $tps_select |
| \`--max-per-host\` slot: \`pg_try_advisory_lock\` over 64 slots, then \`pg_advisory_unlock\` (two statements) | $us_slot | $tps_slot |
| \`--host-rate\` booking: \`INSERT … ON CONFLICT (host) DO UPDATE … RETURNING\` | $us_rate | $tps_rate |

Each server runs its slots and its bookings on one connection each, so these rates bound the fetch starts per
second of one server to limited hosts; a booking covers up to 20 ms of a host's starts at once.
MD
