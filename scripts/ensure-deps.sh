#!/usr/bin/env bash
# Installs the Debian packages a target needs when they are missing.
# Usage: scripts/ensure-deps.sh build|test|bench
set -euo pipefail
want=(libcurl4-openssl-dev libsqlite3-dev libpq-dev pkg-config curl)
case "${1:-build}" in
  build) ;;
  # chromium and chromium-driver: the dashboard's browser test (Tests/Integration/ui.test.sh); bsdutils: script, for
  # cli.test.sh; postgresql: the throwaway cluster of scripts/pg-cluster.sh; openssl: the TLS fixture's CA.
  test) want+=(jq sqlite3 python3 python3-venv chromium chromium-driver bsdutils postgresql openssl) ;;
  # postgresql: bench/75-postgres.sh runs the server on a throwaway cluster.
  bench) want+=(jq sqlite3 nginx-light wrk openssl python3 postgresql) ;;
  *) echo "usage: $0 build|test|bench" >&2; exit 2 ;;
esac
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# nginx may come from another flavour of the package.
if printf '%s\n' "${missing[@]}" | grep -qx nginx-light && command -v nginx >/dev/null; then
  missing=("${missing[@]/nginx-light}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v swift >/dev/null; then
  echo "swift is not on PATH: install the Swift toolchain (swift.org) first" >&2
  exit 1
fi
