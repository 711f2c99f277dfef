#!/usr/bin/env bash
# The `map` node (API.md §7.1), each figure against its reference in the same run:
#  (a) a map over N ids against the same N fetches written out as a static
#      `list` (both after the same ids fetch), 5 runs each, alternating;
#  (b) expansion of a map of E items: from the map starting (its items just
#      resolved) to its first copy starting;
#  (c) resident memory with R copies each resolving a `$ref` to a whole 1 MiB
#      result, against the same R readers of a 2-byte result.
# Sizes: MAP_ITEMS (1000), EXPAND_ITEMS (10000), READERS (1000), RUNS (5).
# Prints a markdown section on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

N=${MAP_ITEMS:-1000}
E=${EXPAND_ITEMS:-10000}
R=${READERS:-1000}
RUNS=${RUNS:-5}

swift build -c release --product jobserver >&2
BIN=$(swift build -c release --show-bin-path)/jobserver

bench_setup

# Static upstream: /ids-N.json, /users/K.json, /big.json (1 MiB of small objects) and /small.json.
mkdir -p "$tmp/www/users"
python3 - "$tmp/www" "$N" "$E" <<'PY'
import json, os, sys
root, n, e = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for count in {n, e}:
    json.dump({"ids": list(range(1, count + 1))}, open(os.path.join(root, "ids-%d.json" % count), "w"))
for k in range(1, max(n, e) + 1):
    with open(os.path.join(root, "users", "%d.json" % k), "w") as f:
        f.write('{"id":%d,"name":"user-%d"}' % (k, k))
items, size, k = [], 2, 0
while size < 1024 * 1024:
    entry = {"id": k, "name": "user-%d" % k, "tags": ["a", "b"]}
    size += len(json.dumps(entry, separators=(",", ":"))) + 1
    items.append(entry)
    k += 1
json.dump({"items": items}, open(os.path.join(root, "big.json"), "w"), separators=(",", ":"))
open(os.path.join(root, "small.json"), "w").write("{}")
PY
chmod -R a+rX "$tmp/www"
start_nginx "$tmp/www"
U="http://127.0.0.1:$nginx_port"
wait_for "$U/small.json"
# An upstream that never answers, for the readers of (c).
start_upstream
hang="http://127.0.0.1:$up_port/hang"

# start_server DB [flags…]: sets server_pid and server_port.
start_server() {
    local db=$1; shift
    server_port=$(free_port)
    "$BIN" serve --host 127.0.0.1 --port "$server_port" --db "$db" "$@" 2>>"$tmp/server.log" &
    server_pid=$!
    pids+=("$server_pid")
    wait_for "http://127.0.0.1:$server_port/healthz"
}
api() { echo "http://127.0.0.1:$server_port$1"; }
submit() { curl -fsS -H 'Content-Type: application/json' --data-binary @"$1" "$(api /v1/jobs)" | jq -r .id; }
settle() { curl -fsS "$(api "/v1/jobs/$1?wait=60")"; }

python3 - "$tmp" "$U" "$N" "$E" "$R" "$hang" <<'PY'
import json, sys
tmp, u, n, e, r, hang = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
def ids(count):
    return {"id": "ids", "type": "fetch", "url": "%s/ids-%d.json" % (u, count), "select": "/body/ids"}
def user_map(count, max_items):
    return {"id": "users", "type": "map", "items": {"$ref": "/nodes/ids/result"}, "max_items": max_items,
            "template": {"type": "fetch", "url": {"$concat": [u + "/users/", {"$ref": "/item"}, ".json"]}}}
def dump(name, graph):
    json.dump({"graph": graph}, open("%s/%s.json" % (tmp, name), "w"))
dump("map", {"type": "sequence", "children": [ids(n), user_map(n, n)]})
dump("list", {"type": "sequence", "children": [ids(n), {"id": "users", "type": "list", "children": [
    {"type": "fetch", "url": "%s/users/%d.json" % (u, k)} for k in range(1, n + 1)]}]})
dump("expand", {"type": "sequence", "children": [ids(e), user_map(e, e)]})
for name, file, count in (("big", "big.json", r), ("one", "big.json", 1), ("small", "small.json", r)):
    dump("readers-" + name, {"type": "sequence", "children": [
        {"id": "big", "type": "fetch", "url": "%s/%s" % (u, file), "select": "/body"},
        {"id": "readers", "type": "map", "items": list(range(count)), "max_items": max(1, count),
         "template": {"type": "fetch", "url": hang, "recover": {"$ref": "/nodes/big/result"}}}]})
PY

# ---- (a) map over N ids vs the same N fetches as a static list
start_server "$tmp/a.sqlite" --max-nodes $((N + 10)) --max-request-bytes 67108864
# elapsed JOB: the job's own time, from its creation to its end (server clocks, ms).
elapsed() { settle "$1" | jq '.finished_at as $f | .created_at as $c | [$f, $c] | map(sub("Z$"; "") | split(".") | (.[0] + "Z" | fromdate) * 1000 + (.[1] | tonumber)) | .[0] - .[1]'; }
map_ms=(); list_ms=()
for run in $(seq 1 "$RUNS"); do
    id=$(submit "$tmp/map.json"); map_ms+=("$(elapsed "$id")")
    id=$(submit "$tmp/list.json"); list_ms+=("$(elapsed "$id")")
    echo "run $run: map ${map_ms[-1]} ms, list ${list_ms[-1]} ms" >&2
done
state=$(settle "$id" | jq -r .state)
stats() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {printf "%s | %s–%s", a[int((NR+1)/2)], a[1], a[NR]}'; }
map_row=$(stats "${map_ms[@]}"); list_row=$(stats "${list_ms[@]}")
map_median=${map_row%% *}; list_median=${list_row%% *}
ratio_a=$(python3 -c "print(f'{$map_median / max(1, $list_median):.2f}')")
kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true

echo "$(date -u +%T) (b)" >&2
# ---- (b) expansion of an E-item map
start_server "$tmp/b.sqlite" --max-nodes $((E + 10))
id=$(submit "$tmp/expand.json")
expand_state=$(settle "$id" | jq -r '"\(.state), \(.progress.total) nodes"')
ms() { jq -r "$1 | sub(\"Z$\"; \"\") | split(\".\") | (.[0] + \"Z\" | fromdate) * 1000 + (.[1] | tonumber)"; }
ids_done=$(curl -fsS "$(api "/v1/jobs/$id/nodes/ids")" | ms .finished_at)
map_start=$(curl -fsS "$(api "/v1/jobs/$id/nodes/users")" | ms .started_at)
first_copy=$(curl -fsS "$(api "/v1/jobs/$id/nodes/users.0")" | ms .started_at)
expand_ms=$((first_copy - map_start))
after_ids_ms=$((first_copy - ids_done))
kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true

echo "$(date -u +%T) (c)" >&2
# ---- (c) R readers of a 1 MiB result vs of a 2-byte one
readers() {
    start_server "$tmp/c-$1.sqlite" --max-nodes $((R + 10)) --max-concurrent-fetches 16
    sleep 1
    local before after id
    before=$(rss_kib "$server_pid")
    id=$(submit "$tmp/readers-$1.json")
    # Every copy resolves its recover when it starts; all start at once (no concurrency bound).
    for _ in $(seq 1 200); do
        [ "$(curl -fsS "$(api "/v1/jobs/$id/nodes/readers")" | jq -r .state)" = running ] && break
        sleep 0.05
    done
    sleep 2
    after=$(rss_kib "$server_pid")
    curl -fsS -o /dev/null -X POST "$(api "/v1/jobs/$id/cancel")"
    kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true
    echo $((after - before))
}
big_kib=$(readers big)
one_kib=$(readers one)
small_kib=$(readers small)
echo "$(date -u +%T) done" >&2
# What each reader of the big result costs beyond the first, against what a reader of the small one costs.
per_big=$(( (big_kib - one_kib) * 1024 / (R > 1 ? R - 1 : 1) ))
per_small=$(( small_kib * 1024 / R ))
extra=$(( per_big - per_small ))
big_bytes=$(stat -c %s "$tmp/www/big.json")

verdict() { python3 -c "print('met' if $1 else 'missed')"; }
cat <<MD
## map

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

### (a) A map over $N ids against the same fetches as a static list

Both jobs are a sequence of the same ids fetch (nginx $(nginx_version), static files on loopback) and then
either a \`map\` whose template fetches \`/users/<id>.json\` or a \`list\` of the same $N fetches written out.
Time is the job's own, \`finished_at − created_at\`; $RUNS runs of each, alternating (last state: $state).

| | median ms | min–max ms |
|---|---:|---:|
| static \`list\` of $N fetches (reference) | $list_row |
| \`map\` over $N ids | $map_row |

Ratio of medians: **$ratio_a** (target ≤ 1.1: $(verdict "$ratio_a <= 1.1")).

### (b) Expanding a map of $E items

A map over $E ids (template: one fetch), \`--max-nodes $((E + 10))\` ($expand_state): its $E copies are
appended to the graph and written to the store in one transaction before any starts.
From the map starting (its items resolved) to its first copy starting: **$expand_ms ms**
($after_ids_ms ms after the ids fetch settled) (target ≤ 200 ms: $(verdict "$expand_ms <= 200")).

### (c) $R readers of a 1 MiB result

$R copies each resolve \`recover: {"\$ref": "/nodes/big/result"}\` when they start (and then wait on an
upstream that never answers), where \`big\` is a $big_bytes-byte JSON document of small objects; the
references are the same job with one reader, and with $R readers of a 2-byte result. Growth of the
server's resident memory from before the submission:

| | KiB |
|---|---:|
| 1 reader of the $big_bytes-byte result (the result parsed once) | $one_kib |
| $R readers of the 2-byte result (reference) | $small_kib |
| $R readers of the $big_bytes-byte result | $big_kib |

Each reader of the large result beyond the first costs **$per_big bytes**, a reader of the 2-byte result
$per_small bytes: **$extra bytes** more per reader, where a copy of the result per reader would be over
$big_bytes (target: no copy per reader: $(verdict "$extra * 16 < $big_bytes")).
MD
