#!/usr/bin/env bash
# Parse + validate of job bodies (JSONValue.parse then JobSpec.parse, as POST /v1/jobs
# does before anything is stored) for each shape at 1x, 10x and 100x a base size:
# time per input byte stays about flat when the cost is linear. Then the bodies
# issue 9 sets targets for. bench/ParseBench, release build, RUNS runs each
# (default 5) after one warm-up; median and min-max. Prints a markdown section.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}

echo "building ParseBench (release)" >&2
swift build -c release --product ParseBench >&2
bench_bin=$(swift build -c release --show-bin-path)/ParseBench

status=0
table=$("$bench_bin" "$RUNS") || status=$?
# 3: ran, but a target was missed (the table says which); anything else is a failure.
if [ "$status" -ne 0 ] && [ "$status" -ne 3 ]; then
  echo "ParseBench failed ($status)" >&2
  exit "$status"
fi

cat <<MD
## Parse and validate: time per byte at 1×, 10×, 100×

\`JSONValue.parse\` then \`JobSpec.parse\` in one process (no HTTP, no store), on bodies
built in memory, each under the limits the server would apply (\`--max-depth\` raised to
the chain's depth, \`--max-nodes\` to the list's length). $RUNS runs after one warm-up;
median and min–max. Linear cost shows as a flat ns/byte down each shape's three rows.
Commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- Sources bench || echo " (with local changes)").

$table

Command: \`RUNS=$RUNS bench/05-parse.sh\` (runs \`$(realpath --relative-to=. "$bench_bin") $RUNS\`).
MD
