#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks, on 127.0.0.1.
#   scripts/pg-cluster.sh start DIR [PORT]   initdb in DIR, start it, print its postgres:// URL
#   scripts/pg-cluster.sh stop DIR           stop it (immediate) and remove DIR
# As root the cluster runs as the unprivileged user `nobody` (PostgreSQL refuses to run as root), so DIR's
# parent must be one `nobody` can enter, such as /tmp.
# PG_FSYNC=off skips fsync for speed (tests only: a crash of PostgreSQL itself could then lose commits).
set -euo pipefail
cmd="${1:-}"; dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2; }
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -x "$bin/initdb" ] || { echo "pg-cluster: PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}
case "$cmd" in
  start)
    port="${3:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then
      chown nobody "$dir"
      runuser -u nobody -- test -x "$dir" || { echo "pg-cluster: user nobody cannot enter $dir (use a folder under /tmp)" >&2; exit 1; }
    fi
    chmod 700 "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U jobserver --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { echo "pg-cluster: initdb failed:" >&2; cat "$dir/initdb.log" >&2; exit 1; }
    # The server would hold every descriptor inherited beyond 0-2 for its lifetime, and a parent waiting for
    # one of them to close (a pipe, or the socket Foundation's Process watches) would wait forever.
    for fd in $(ls /proc/$$/fd); do
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200"
    [ "${PG_FSYNC:-on}" = off ] && opts="$opts -c fsync=off -c full_page_writes=off"
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 -o "$opts" start >/dev/null \
      || { echo "pg-cluster: the server did not start:" >&2; tail -20 "$dir/server.log" >&2; exit 1; }
    echo "postgres://jobserver@127.0.0.1:$port/postgres"
    ;;
  stop)
    if [ -d "$dir/data" ]; then as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir"
    ;;
  *) echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
