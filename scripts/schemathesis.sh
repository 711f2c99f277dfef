#!/usr/bin/env bash
# Property-based conformance run of a live server against openapi.yaml.
# Usage: scripts/schemathesis.sh BASE_URL     e.g. http://127.0.0.1:8080
#
# Checks: all of schemathesis's checks (no 5xx other than the documented 503;
# every status, header, content type and body as openapi.yaml documents;
# invalid input refused, valid input accepted; authentication as declared),
# in every phase including the stateful one, which follows openapi.yaml's links
# from a submitted job to its reads, cancel and delete. Bounded: a fixed seed,
# SCHEMATHESIS_MAX_EXAMPLES examples per operation (15; `make fuzz` raises it),
# long-polls pinned to wait=1 (see scripts/schemathesis.toml), and the whole
# run under a hard time limit. Against a local server it takes 1–3 minutes.
#
# Generated jobs fetch generated URLs. Run the server under test so that none
# of them leaves the machine, e.g. with `--deny-cidr 0.0.0.0/0` (fetches then
# fail before connecting, which is a valid outcome for the API), and without
# `--token` (or pass SCHEMATHESIS_TOKEN).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BASE_URL" >&2
  exit 2
fi
base="${1%/}"
venv=.build/pyvenv
max_examples="${SCHEMATHESIS_MAX_EXAMPLES:-15}"
seed="${SCHEMATHESIS_SEED:-20261202}"
limit_s="${SCHEMATHESIS_TIME_LIMIT:-300}"

# The venv (and the spec's validity) come from check-openapi.sh.
scripts/check-openapi.sh >/dev/null

# Fail fast and clearly when nothing answers at BASE_URL.
if ! curl -fsS -o /dev/null --max-time 5 "$base/healthz"; then
  echo "schemathesis: no healthy jobserver at $base (GET /healthz failed)" >&2
  exit 1
fi

auth=()
if [ -n "${SCHEMATHESIS_TOKEN:-}" ]; then
  auth=(-H "Authorization: Bearer $SCHEMATHESIS_TOKEN")
fi

report_dir=.build/schemathesis-report
mkdir -p "$report_dir"

# `timeout` bounds the run even if a request hangs (a long-poll may wait 60 s,
# hence the request timeout above that).
rc=0
timeout --signal=TERM --kill-after=10 "$limit_s" \
  "$venv/bin/st" --config-file scripts/schemathesis.toml run openapi.yaml \
    --url "$base" \
    --checks all \
    --phases examples,coverage,fuzzing,stateful \
    --max-examples "$max_examples" \
    --seed "$seed" \
    --generation-allow-x00 false \
    --workers 1 \
    --request-timeout 65 \
    --max-failures 50 \
    --report junit --report-dir "$report_dir" \
    --no-color \
    ${auth[@]+"${auth[@]}"} || rc=$?

if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "schemathesis: did not finish within ${limit_s}s" >&2
fi
exit "$rc"
