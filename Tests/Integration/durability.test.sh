#!/usr/bin/env bash
# Nothing acknowledged is lost or undone by a crash (issue 10, acceptance 2):
# rounds of submits, cancels and deletes from 8 parallel clients against a
# hanging and slow upstream, `kill -9` of the server at a random moment, then
# a restart on the same database. Every acknowledged answer is recorded (201
# ids, 202 cancels, 204 deletes) and checked after each restart, over all
# rounds so far: no acknowledged job lost, no answered cancel undone (the job
# is `cancelled`), no answered delete undone (404 for the job and its nodes),
# no node left pending or running in a settled job. Each delete is raced by
# four readers of the job and its nodes, as the issue describes.
#
#   DURABILITY_ROUNDS  rounds (default 5; the issue's acceptance runs 50)
#   DURABILITY_OPS     requests per client and round (default 12, kept short
#                      for `make test`; the acceptance runs 25: 200 a round)
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC2119
source "$(dirname "$0")/lib.sh"
# comm, join and sort must agree on one order.
export LC_ALL=C
# A check that breaks (rather than finds a fault) says where.
trap 'echo "FAIL $TEST_NAME: line $LINENO: $BASH_COMMAND exited $?" >&2' ERR

rounds="${DURABILITY_ROUNDS:-5}"
ops="${DURABILITY_OPS:-12}"
clients=8
# Hanging transfers must not hold back the others behind the per-host limit.
flags=(--max-per-host 4096 --max-concurrent-fetches 4096)

start_upstream
mkdir -p "$TMP/db" "$TMP/acks" "$TMP/ops"
db="$TMP/db/jobserver.sqlite"
start_server_on "$db" "${flags[@]}"

# The kinds of job a client submits: one that hangs until cancelled, a slow
# one, a quick one, and a list that settles on its first result and leaves
# its slow child running (cancel_remaining: false).
bodies=(
  "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/hang\"}}"
  "{\"graph\":{\"type\":\"sequence\",\"children\":[{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/300\"},{\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/1500\"}]}}"
  "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
  "{\"graph\":{\"type\":\"list\",\"fire_on_first_result\":true,\"cancel_remaining\":false,\"children\":[{\"id\":\"fast\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"},{\"id\":\"slow\",\"type\":\"fetch\",\"url\":\"$UPSTREAM/delay/3000\"}]}}"
)

# reader ID OUT: reads the job and its node list three times, as a client
# polling it would; a node list that is empty (no job has none) is noted.
reader() {
  local k answer
  for ((k = 0; k < 3; k++)); do
    curl -s -o /dev/null --max-time 5 "$BASE/v1/jobs/$1" 2>/dev/null || true
    answer="$(curl -s --max-time 5 -w '\n%{http_code}' "$BASE/v1/jobs/$1/nodes" 2>/dev/null || true)"
    if [ "${answer##*$'\n'}" = 200 ] && [[ "$answer" == '{"nodes":[]}'* ]]; then echo "empty-nodes $1" >>"$2"; fi
  done
}

# client ROUND N: OPS requests against $BASE; appends one line per answer that
# promises something ("created ID", "cancelled ID", "deleted ID"), one per
# delete left without an answer ("maybe-deleted ID": it may have happened),
# and one per read that found a job after its 204 ("resurrected ID"); and a
# byte per request done to $TMP/ops/ROUND, which all the round's clients share.
client() {
  local out="$TMP/acks/$1.$2" done="$TMP/ops/$1" mine=() cancelled=() readers=() i op answer code id r
  for ((i = 0; i < ops; i++)); do
    op=$((RANDOM % 10))
    if ((op < 4 || ${#mine[@]} == 0)); then
      answer="$(curl -s --max-time 15 -w '\n%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "${bodies[RANDOM % ${#bodies[@]}]}" "$BASE/v1/jobs" 2>/dev/null || true)"
      code="${answer##*$'\n'}"
      if [ "$code" = 201 ] && [[ "$answer" =~ \"id\":\"([^\"]+)\" ]]; then
        echo "created ${BASH_REMATCH[1]}" >>"$out"
        mine+=("${BASH_REMATCH[1]}")
      fi
    elif ((op < 7)); then
      id="${mine[RANDOM % ${#mine[@]}]}"
      code="$(curl -s -o /dev/null --max-time 15 -w '%{http_code}' -X POST "$BASE/v1/jobs/$id/cancel" 2>/dev/null || true)"
      if [ "$code" = 202 ]; then
        echo "cancelled $id" >>"$out"
        cancelled+=("$id")
      fi
    else
      if ((${#cancelled[@]} > 0 && RANDOM % 2 == 0)); then
        id="${cancelled[RANDOM % ${#cancelled[@]}]}"
      else
        id="${mine[RANDOM % ${#mine[@]}]}"
      fi
      # Four readers race the delete (issue 10: a read could put a deleted job back).
      readers=()
      for r in 1 2 3 4; do
        reader "$id" "$out" &
        readers+=("$!")
      done
      code="$(curl -s -o /dev/null --max-time 15 -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$id" 2>/dev/null || true)"
      for r in "${readers[@]}"; do wait "$r" || true; done
      case "$code" in
        204)
          echo "deleted $id" >>"$out"
          # Every read after the 204 (and after the racing reads) answers 404.
          for r in "$id" "$id/nodes"; do
            code="$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$BASE/v1/jobs/$r" 2>/dev/null || true)"
            case "$code" in 404 | 000) ;; *) echo "resurrected $id" >>"$out" ;; esac
          done
          ;;
        404 | 409) ;;
        *) echo "maybe-deleted $id" >>"$out" ;;
      esac
    fi
    printf . >>"$done"
  done
}

# Every stored job as "id state unsettled-node-count-by-progress", from the listing.
list_all() {
  local cursor="" page next i
  : >"$TMP/listed"
  for ((i = 0; i < 10000; i++)); do
    api GET "/v1/jobs?limit=500${cursor:+&cursor=$cursor}"
    expect_status 200
    jq -r '.jobs[] | "\(.id) \(.state) \(.progress.pending + .progress.running)"' <<<"$RESP" >>"$TMP/listed"
    next="$(jget .next_cursor)"
    [ "$next" = null ] && return 0
    cursor="$next"
  done
  fail "the listing did not end within 10000 pages"
}

# A round killed before its first answer has no file yet: nothing to read is no error.
acks() { { cat "$TMP"/acks/* 2>/dev/null || true; } | awk -v k="$1" '$1 == k { print $2 }' | sort -u; }
round_acks() { { cat "$TMP"/acks/"$1".* 2>/dev/null || true; } | awk -v k="$2" '$1 == k { print $2 }' | sort -u; }

total_created=0 total_cancelled=0 total_deleted=0
lost=0 undone_cancels=0 undone_deletes=0 unsettled=0 empty_nodes=0
for ((round = 1; round <= rounds; round++)); do
  pids=()
  for ((c = 0; c < clients; c++)); do
    client "$round" "$c" &
    pids+=("$!")
  done
  STARTED_PIDS+=("${pids[@]}")
  # A random moment of the round, whatever the machine's speed: once a random number of its requests
  # have been answered (every client done is all of them), or 60 s passed.
  target=$((1 + RANDOM % (clients * ops)))
  follow "$TMP/ops/$round" 0 60 "" head -c "$target" >/dev/null || true
  kill -KILL "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  for pid in "${pids[@]}"; do wait "$pid" || true; done

  start_server_on "$db" "${flags[@]}"
  list_all
  acks created >"$TMP/created"
  acks cancelled >"$TMP/cancelled"
  acks deleted >"$TMP/deleted"
  acks maybe-deleted | sort -u - "$TMP/deleted" >"$TMP/gone-maybe"
  awk '{ print $1 }' "$TMP/listed" | sort -u >"$TMP/present"

  # Acknowledged, not (possibly) deleted, and not stored any more.
  round_lost="$(comm -23 "$TMP/created" "$TMP/gone-maybe" | comm -23 - "$TMP/present" | wc -l)"
  # Answered 202, not deleted since, and not cancelled now.
  round_undone_cancels="$(comm -23 "$TMP/cancelled" "$TMP/gone-maybe" \
    | join - <(sort -k1,1 "$TMP/listed") | awk '$2 != "cancelled"' | wc -l)"
  # Answered 204 and listed again, or read after the 204; node lists read empty while a delete ran.
  round_undone_deletes="$(comm -12 "$TMP/deleted" "$TMP/present" | wc -l)"
  round_undone_deletes=$((round_undone_deletes + $(round_acks "$round" resurrected | wc -l)))
  round_empty_nodes="$(round_acks "$round" empty-nodes | wc -l)"

  # This round's deletes, one by one: the job and its nodes answer 404.
  for id in $(round_acks "$round" deleted | awk 'NR <= 20'); do
    api GET "/v1/jobs/$id"
    [ "$STATUS" = 404 ] || { round_undone_deletes=$((round_undone_deletes + 1)); log "deleted job $id answers $STATUS"; }
    api GET "/v1/jobs/$id/nodes"
    [ "$STATUS" = 404 ] || { round_undone_deletes=$((round_undone_deletes + 1)); log "nodes of deleted job $id answer $STATUS"; }
  done
  # Settled jobs with nodes pending or running: those the listing's progress counts, and this round's
  # settled jobs looked at node by node. A job resumed by the restart may rightly have settled with its
  # slow child still running (it ends within 3 s); a node the crash left behind never settles.
  {
    awk '$2 != "pending" && $2 != "running" && $3 > 0 { print $1 }' "$TMP/listed"
    round_acks "$round" created | join - <(sort -k1,1 "$TMP/listed") \
      | awk '$2 != "pending" && $2 != "running" { print $1 }' | awk 'NR <= 30'
  } | sort -u >"$TMP/suspects"
  round_unsettled=0
  deadline=$((SECONDS + 15))
  unsettled_filter='[.nodes[] | select(.state == "pending" or .state == "running")] | length == 0'
  while read -r id; do
    if ! wait_nodes "$id" "$unsettled_filter" $((deadline - SECONDS)); then
      n="$(jq '[.nodes[] | select(.state == "pending" or .state == "running")] | length' <<<"$RESP")"
      round_unsettled=$((round_unsettled + n))
      log "settled job $id keeps $n unsettled nodes: $(jq -c '[.nodes[] | {id, state}]' <<<"$RESP")"
    fi
  done <"$TMP/suspects"

  # Hanging jobs left running would pile up round after round: cancel them (these answers count too).
  for id in $(awk '$2 == "pending" || $2 == "running" { print $1 }' "$TMP/listed"); do
    api POST "/v1/jobs/$id/cancel"
    [ "$STATUS" = 202 ] && echo "cancelled $id" >>"$TMP/acks/$round.cleanup"
  done

  lost=$((lost + round_lost))
  undone_cancels=$((undone_cancels + round_undone_cancels))
  undone_deletes=$((undone_deletes + round_undone_deletes))
  unsettled=$((unsettled + round_unsettled))
  empty_nodes=$((empty_nodes + round_empty_nodes))
  total_created="$(wc -l <"$TMP/created")"
  total_cancelled="$(wc -l <"$TMP/cancelled")"
  total_deleted="$(wc -l <"$TMP/deleted")"
  log "round $round (kill at request $target of $((clients * ops))): lost $round_lost, cancels undone $round_undone_cancels," \
    "deletes undone $round_undone_deletes, empty node lists $round_empty_nodes," \
    "settled jobs with unsettled nodes $round_unsettled" \
    "(so far: $total_created created, $total_cancelled cancelled, $total_deleted deleted)"
done

log "$rounds rounds: $total_created acknowledged jobs, $total_cancelled answered cancels, $total_deleted answered deletes;" \
  "lost $lost, cancels undone $undone_cancels, deletes undone $undone_deletes, empty node lists $empty_nodes," \
  "unsettled nodes in settled jobs $unsettled"
[ "$lost" = 0 ] || fail "$lost acknowledged jobs lost"
[ "$undone_cancels" = 0 ] || fail "$undone_cancels answered cancels undone"
[ "$undone_deletes" = 0 ] || fail "$undone_deletes answered deletes undone"
[ "$unsettled" = 0 ] || fail "$unsettled nodes left unsettled in settled jobs"
[ "$empty_nodes" = 0 ] || fail "$empty_nodes node lists answered empty during a delete"
[ "$total_created" -gt 0 ] || fail "no job was acknowledged; the test proves nothing"
