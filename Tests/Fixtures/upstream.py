#!/usr/bin/env python3
"""Upstream HTTP fixture for the jobserver tests (Python 3 stdlib only).

Usage: python3 Tests/Fixtures/upstream.py [--port 0] [--host 127.0.0.1] [--exit-on-stdin-eof]
                                          [--tls-cert PEM --tls-key PEM]
The first stdout line is `listening <port>`; it then serves until killed.
HTTP/1.1 with keep-alive, one thread per connection; HTTPS (ALPN http/1.1)
with --tls-cert and --tls-key, the handshake made on the connection's thread.

Endpoints (any method unless noted; HEAD answers like GET without a body):
  /json                  200 application/json {"ok":true}
  /json?size=N           200 a valid JSON object of exactly N bytes (N >= 2)
  /status/{code}         that status, JSON body {"status":code}
  /delay/{ms}            sleeps ms, then 200 {"delayed_ms":ms}; a client that
                         disconnects meanwhile is recorded in /stats disconnects
  /bytes/{n}             n bytes application/octet-stream, streamed in 64 KiB
                         chunks; ?type=T overrides the content type; ?chunked=1
                         sends it chunked, without Content-Length
  /text                  text/plain; charset=utf-8 "hello, world"
  /invalid-json          application/json body {"broken":
  /hang                  answers nothing; waits until the client disconnects
                         (at most 120 s) and records the disconnect
  /reset                 closes the connection with an RST (SO_LINGER 0)
  /redirect/{n}          302 to /redirect/{n-1}; /redirect/0 is 200 {"redirected":true}
  /redirect-to?url=U     302 to U
  /count/{key}           increments counter key, 200 {"key":key,"count":n};
                         ?fail=N answers 503 for the first N hits of key
                         (?fail_status=429 to choose the status,
                         ?retry_after=S adds Retry-After: S); ?delay_ms=D
                         sleeps D ms before answering
  /span/{key}            records when the request began and ended under key
                         (?tag=T labels it, ?delay_ms=D sleeps D ms first;
                         ?pid=NAME also records as "pid" the process id of the
                         client, a process whose name starts with NAME, found
                         through /proc);
                         200 {"key":key,"tag":T}; see "spans" in /stats
  /echo, /echo/*         200 {"method","path","query","headers":{lowercased
                         name: value},"body":"<utf8 text>"}
  /headers               200 with two Set-Cookie, two X-Multi and an X-Upper header
  /gzip/json             200 application/json {"gzipped":true}, gzip-encoded
                         when the request's Accept-Encoding offers gzip, else
                         plain; ?size=N makes the decoded JSON N bytes
  /gzip/text             the same with text/plain "hello, gzip"
  /gzip/forced           200 application/json {"forced":true}, gzip-encoded
                         whatever the request's Accept-Encoding says
  /gzip/bomb             200 application/octet-stream: ?mib=N (default 100)
                         MiB of zeros gzip-encoded (about 1/1000 of that on
                         the wire), whatever Accept-Encoding says
  /loop                  302 to itself, forever
  /big-header            200 with one X-Big header line of ?kib=N KiB (default 200)
  /many-headers          200 with ?count=N header lines (default 100) of ?kib=K
                         KiB each (default 50)
  /close                 reads the request, closes without answering
  /garbage               answers bytes that are not HTTP, then closes
  POST /login            body {"user": U, …}: 200 {"token": "tok-U", "user": U}
                         (the token is remembered); 400 without a string user
  /me                    200 {"user": U} with `Authorization: Bearer <a token
                         /login gave>`; else 401 {"error": "unauthorized"}
  /ids?n=N               200 {"ids": [1, …, N], "count": N} (N defaults to 3)
  /pages/{kind}          a paged collection of ?n=N pages (default 3) of ?per=P
                         items (default 2): items {"id": k} numbered from 1;
                         each hit of page K counts in counter "{key}:{K}"
                         (?key= defaults to the kind); ?slow=K&slow_ms=D sleeps
                         D ms (a disconnect is recorded) before answering page
                         K; ?fail=K answers page K's first hit with 503.
                         Kinds:
                         link    ?page=K, body the items array, Link header
                                 <absolute URL>; rel="next" (and rel="last")
                                 while K < N
                         url     ?page=K, {"items": […], "next": "/pages/url?…"}
                                 (a relative URL; ?abs=1 absolute, ?next_host=H
                                 absolute on host H, same port), null last
                         cursor  ?cursor=cK (none for page 1),
                                 {"data": {"items": […]}, "next_cursor": "cK+1"},
                                 "" last
                         number  ?page=K, {"items": […]}; K > N gives []
                         cross   like link, but next goes to the other loopback
                                 name (127.0.0.1 <-> localhost), same port
  /users/{id}            200 {"id": id, "name": "user-<id>"} (id a number when
                         it is digits); counts each hit in counter users/<id>;
                         ?fail=A,B,… answers 500 for those ids; ?delay_ms=D
                         sleeps D ms before answering
  /cache/{key}           counts key like /count, 200 {"key":key,"count":n} with
                         ETag "\"{key}-v1\"" and Cache-Control from ?cc=V
                         (e.g. max-age=2, no-store); ?vary=H adds Vary: H;
                         ?age=S adds Age: S; ?etag=0 leaves the ETag out;
                         ?delay_ms=D sleeps D ms before answering;
                         ?size=N pads the body to N bytes; an If-None-Match
                         that matches answers 304 and counts key:304
  /rate/{key}            200 {"key":key}; records the arrival time (epoch
                         seconds) in /stats arrivals[key]
  GET /stats             {"counters":{key:n},"requests":total,"connections":
                         connections accepted (this request's own included),
                         "active":in flight,
                         "max_active":high-water mark of concurrent requests,
                         "max_active_by_path_prefix":{"/delay":n,...},
                         "disconnects":[{"path":p,"at":epoch seconds}],
                         "spans":{key:[{"tag":T,"start":s,"end":s}]} in
                         order of arrival, epoch seconds,
                         "arrivals":{key:[epoch seconds]},
                         "generation":n} where n grows at every change;
                         ?after=N&wait=S answers once generation exceeds N,
                         or after S seconds (at most 30): a test awaits a
                         change instead of polling
  POST /stats/reset      resets everything above; 200 {"reset":true}
/stats and /stats/reset are not counted in requests/active.
"""

import argparse
import gzip
import json
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


# Tokens handed out by /login, for /me.
TOKENS = {}
TOKENS_LOCK = threading.Lock()


def peer_socket_inode(connection):
    """The inode of the local socket at the other end of a loopback TCP connection, or None. Asked of the kernel
    by its exact addresses (sock_diag netlink), which is one atomic answer: reading /proc/net/tcp instead walks a
    table that changes under the reader, and an entry can be skipped while other connections open and close."""
    family = connection.family
    peer, own = connection.getpeername(), connection.getsockname()
    def address(host):
        packed = socket.inet_pton(family, host)
        return packed + bytes(16 - len(packed))
    # inet_diag_req_v2 for the peer's socket: source = the peer, destination = this end, no cookie.
    sockid = struct.pack("!HH", peer[1], own[1]) + address(peer[0]) + address(own[0]) + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 20, 1, 2
    message = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + request
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4) as diag:  # NETLINK_SOCK_DIAG
            diag.settimeout(2)
            diag.sendto(message, (0, 0))
            answer = diag.recv(65536)
    except OSError:
        return proc_table_inode(peer, own)
    length, kind = struct.unpack_from("=IH", answer, 0)
    if kind == NLMSG_ERROR or length < 16 + 72:
        return None
    # inet_diag_msg: family, state, timer, retrans (4 bytes), sockid (48), expires, rqueue, wqueue, uid, inode.
    inode = struct.unpack_from("=I", answer, 16 + 4 + 48 + 16)[0]
    return inode or None


def proc_table_inode(peer, own):
    """The same from /proc/net/tcp, where netlink is not allowed."""
    want, other = ":%04X" % peer[1], ":%04X" % own[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                # An older connection between the same two ports may linger in TIME_WAIT, owned by no process
                # (inode 0): it is not this one.
                if fields[1].endswith(want) and fields[2].endswith(other) and fields[9] != "0":
                    return int(fields[9])
    return None


class Changes:
    """The lock around the counters: each time it is left, the counters changed, so the generation grows and the
    long-polls of GET /stats?after=N look again."""

    def __init__(self):
        self.condition = threading.Condition()
        self.generation = 0

    def __enter__(self):
        self.condition.acquire()

    def __exit__(self, *exc):
        self.generation += 1
        self.condition.notify_all()
        self.condition.release()
        return False


class Stats:
    """Counters shared by all handler threads, guarded by one lock; every change under it is counted."""

    def __init__(self):
        self.lock = Changes()
        self.reset()

    def reset(self):
        self.counters = {}
        self.requests = 0
        self.connections = 0
        self.active = 0
        self.max_active = 0
        self.active_by_prefix = {}
        self.max_active_by_prefix = {}
        self.disconnects = []
        self.spans = {}
        self.arrivals = {}

    def begin(self, prefix):
        with self.lock:
            self.requests += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            n = self.active_by_prefix.get(prefix, 0) + 1
            self.active_by_prefix[prefix] = n
            self.max_active_by_prefix[prefix] = max(self.max_active_by_prefix.get(prefix, 0), n)

    def end(self, prefix):
        with self.lock:
            self.active -= 1
            self.active_by_prefix[prefix] = self.active_by_prefix.get(prefix, 1) - 1

    def wait_for_change(self, after, seconds):
        """Returns once the counters changed since generation `after`, or after `seconds`."""
        with self.lock.condition:
            self.lock.condition.wait_for(lambda: self.lock.generation > after, timeout=seconds)

    def snapshot(self):
        # Reading is not a change: the condition's own lock, which wakes nobody.
        with self.lock.condition:
            return {
                "generation": self.lock.generation,
                "counters": dict(self.counters),
                "requests": self.requests,
                "connections": self.connections,
                "active": self.active,
                "max_active": self.max_active,
                "max_active_by_path_prefix": dict(self.max_active_by_prefix),
                "disconnects": list(self.disconnects),
                "spans": {k: list(v) for k, v in self.spans.items()},
                "arrivals": {k: list(v) for k, v in self.arrivals.items()},
            }


STATS = Stats()


GZIP_BOMBS = {}
GZIP_BOMBS_LOCK = threading.Lock()


def gzip_bomb(mib):
    """`mib` MiB of zeros, gzip-compressed once and kept."""
    with GZIP_BOMBS_LOCK:
        if mib not in GZIP_BOMBS:
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            zeros = b"\0" * (1024 * 1024)
            parts = [z.compress(zeros) for _ in range(mib)]
            parts.append(z.flush())
            GZIP_BOMBS[mib] = b"".join(parts)
        return GZIP_BOMBS[mib]


def json_of_size(n):
    if n >= 8:
        return ('{"p":"' + "x" * (n - 8) + '"}').encode()
    return ("{" + " " * (n - 2) + "}").encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body go out in separate writes: with Nagle's algorithm the body would wait for the client's
    # delayed ACK of the head, 40 ms on every request of a kept-alive connection.
    disable_nagle_algorithm = True
    server_version = "upstream-fixture/1"

    def log_message(self, format, *args):
        pass

    def setup(self):
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            # Here, not in accept(): one slow handshake must not hold up the others.
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError):
                self.close_connection = True
                raise ConnectionResetError("TLS handshake failed")
        with STATS.lock:
            STATS.connections += 1

    def offers_gzip(self):
        offered = (self.headers.get("Accept-Encoding") or "").lower()
        return any(part.split(";")[0].strip() in ("gzip", "x-gzip", "*") for part in offered.split(","))

    def send_gzip(self, body, content_type, encode):
        extra = [("Content-Encoding", "gzip")] if encode else []
        self.send_body(200, gzip.compress(body) if encode else body, content_type, extra=extra)

    # -- helpers -----------------------------------------------------------

    def read_body(self):
        length = self.headers.get("Content-Length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return b""
            return self.rfile.read(n) if n > 0 else b""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                out += self.rfile.read(size)
                self.rfile.readline(1024)
            return bytes(out)
        return b""

    def send_body(self, status, body, content_type="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status, value, extra=()):
        self.send_body(status, json.dumps(value, separators=(",", ":")).encode(), extra=extra)

    def client_gone(self):
        """True when the peer has closed its side (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            if isinstance(self.connection, ssl.SSLSocket):
                # TLS cannot peek: a close_notify or an EOF reads as b"", a partial record wants more.
                self.connection.setblocking(False)
                try:
                    return self.connection.recv(1) == b""
                except ssl.SSLWantReadError:
                    return False
                finally:
                    self.connection.setblocking(True)
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def wait(self, seconds, path):
        """Sleeps up to `seconds`; returns False (and records it) if the client disconnects."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            try:
                readable, _, _ = select.select([self.connection], [], [], min(remaining, 0.005))
            except OSError:
                readable = [self.connection]
            if readable and self.client_gone():
                with STATS.lock:
                    STATS.disconnects.append({"path": path, "at": time.time()})
                self.close_connection = True
                return False
            if readable:
                # Pipelined data, not a close: keep sleeping without spinning.
                time.sleep(min(remaining, 0.005))

    def reset_connection(self):
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        fd = self.connection.detach()
        os.close(fd)
        self.close_connection = True

    def client_pid(self, name):
        """The pid of the local process named name… whose socket is this connection's other end, or None; looked up
        once per connection (again while it is not found), among the processes of that name only (scanning every
        process's descriptors takes seconds on a busy machine)."""
        if getattr(self, "_client_pid", None) is not None:
            return self._client_pid
        self._client_pid = None
        try:
            inode = peer_socket_inode(self.connection)
            if inode:
                target = "socket:[%d]" % inode
                for pid in os.listdir("/proc"):
                    if not pid.isdigit():
                        continue
                    try:
                        with open("/proc/%s/comm" % pid) as f:
                            if not f.read().startswith(name[:15]):
                                continue
                        fds = os.listdir("/proc/%s/fd" % pid)
                    except OSError:
                        continue
                    for fd in fds:
                        # A busy client closes descriptors while they are read: one gone must not end the search.
                        try:
                            if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == target:
                                self._client_pid = int(pid)
                                return self._client_pid
                        except OSError:
                            continue
        except OSError:
            pass
        return self._client_pid

    # -- dispatch ----------------------------------------------------------

    def handle_any(self):
        parts = urlsplit(self.path)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        if path == "/stats":
            self.read_body()
            if "after" in query:
                STATS.wait_for_change(int(query["after"]), min(float(query.get("wait", "5")), 30.0))
            self.send_json(200, STATS.snapshot())
            return
        if path == "/stats/reset":
            self.read_body()
            with STATS.lock:
                STATS.reset()
            self.send_json(200, {"reset": True})
            return
        segments = path.split("/")
        prefix = "/" + segments[1] if len(segments) > 1 else "/"
        STATS.begin(prefix)
        try:
            body = self.read_body()
            self.route(path, segments, query, parts.query, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            STATS.end(prefix)

    def route(self, path, segments, query, raw_query, body):
        arg = segments[2] if len(segments) > 2 else ""
        if path == "/json":
            if "size" in query:
                size = int(query["size"])
                if size < 2:
                    self.send_json(400, {"error": "size must be >= 2"})
                    return
                self.send_body(200, json_of_size(size))
            else:
                self.send_body(200, b'{"ok":true}')
        elif segments[1] == "status" and arg.isdigit():
            code = int(arg)
            self.send_json(code, {"status": code})
        elif segments[1] == "delay" and arg.isdigit():
            ms = int(arg)
            if self.wait(ms / 1000.0, path):
                self.send_json(200, {"delayed_ms": ms})
        elif segments[1] == "bytes" and arg.isdigit():
            self.send_bytes(int(arg), query.get("type", "application/octet-stream"), query.get("chunked") == "1")
        elif segments[1] == "cache" and arg:
            self.cache(arg, query)
        elif segments[1] == "rate" and arg:
            with STATS.lock:
                STATS.arrivals.setdefault(arg, []).append(time.time())
            self.send_json(200, {"key": arg})
        elif path == "/text":
            self.send_body(200, b"hello, world", "text/plain; charset=utf-8")
        elif path == "/invalid-json":
            self.send_body(200, b'{"broken":')
        elif path == "/hang":
            self.wait(120.0, path)
            self.close_connection = True
        elif path == "/reset":
            self.reset_connection()
        elif segments[1] == "redirect" and arg.isdigit():
            n = int(arg)
            if n == 0:
                self.send_json(200, {"redirected": True})
            else:
                self.send_json(302, {"redirect": n - 1}, extra=[("Location", "/redirect/%d" % (n - 1))])
        elif path == "/redirect-to":
            self.send_json(302, {"redirect": query.get("url", "")}, extra=[("Location", query.get("url", "/"))])
        elif segments[1] == "span" and arg:
            span = {"tag": query.get("tag", ""), "start": time.time(), "end": None}
            if query.get("pid"):
                span["pid"] = self.client_pid(query["pid"])
            with STATS.lock:
                STATS.spans.setdefault(arg, []).append(span)
            if self.wait(int(query.get("delay_ms", "0")) / 1000.0, path):
                if query.get("pid") and span["pid"] is None:
                    # The client is still there to be answered: look again, should the first look have missed it.
                    span["pid"] = self.client_pid(query["pid"])
                with STATS.lock:
                    span["end"] = time.time()
                self.send_json(200, {"key": arg, "tag": span["tag"]})
        elif segments[1] == "count" and arg:
            self.count(arg, query, path)
        elif path == "/echo" or path.startswith("/echo/"):
            headers = {}
            for name, value in self.headers.items():
                key = name.lower()
                headers[key] = headers[key] + ", " + value if key in headers else value
            self.send_json(200, {
                "method": self.command,
                "path": path,
                "query": raw_query,
                "headers": headers,
                "body": body.decode("utf-8", errors="replace"),
            })
        elif path == "/login" and self.command == "POST":
            try:
                user = json.loads(body.decode("utf-8")).get("user")
            except (ValueError, AttributeError):
                user = None
            if not isinstance(user, str):
                self.send_json(400, {"error": "a string user is required"})
                return
            token = "tok-" + user
            with TOKENS_LOCK:
                TOKENS[token] = user
            self.send_json(200, {"token": token, "user": user})
        elif path == "/me":
            auth = self.headers.get("Authorization", "")
            with TOKENS_LOCK:
                user = TOKENS.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
            if user is None:
                self.send_json(401, {"error": "unauthorized"})
            else:
                self.send_json(200, {"user": user})
        elif path == "/ids":
            n = int(query.get("n", "3"))
            self.send_json(200, {"ids": list(range(1, n + 1)), "count": n})
        elif segments[1] == "pages" and arg in ("link", "url", "cursor", "number", "cross"):
            self.pages(arg, query)
        elif segments[1] == "users" and arg and len(segments) == 3:
            with STATS.lock:
                STATS.counters["users/" + arg] = STATS.counters.get("users/" + arg, 0) + 1
            if "delay_ms" in query and not self.wait(int(query["delay_ms"]) / 1000.0, path):
                return
            if arg in query.get("fail", "").split(","):
                self.send_json(500, {"error": "user %s failed" % arg})
                return
            self.send_json(200, {"id": int(arg) if arg.isdigit() else arg, "name": "user-" + arg})
        elif path == "/headers":
            self.send_body(200, b'{"headers":true}', extra=[
                ("Set-Cookie", "a=1"), ("X-Multi", "one"), ("Set-Cookie", "b=2"),
                ("X-Multi", "two"), ("X-Upper", "UPPER"),
            ])
        elif path == "/gzip/json":
            if "size" in query:
                payload = json_of_size(max(2, int(query["size"])))
            else:
                payload = b'{"gzipped":true}'
            self.send_gzip(payload, "application/json", self.offers_gzip())
        elif path == "/gzip/text":
            self.send_gzip(b"hello, gzip", "text/plain; charset=utf-8", self.offers_gzip())
        elif path == "/gzip/forced":
            self.send_gzip(b'{"forced":true}', "application/json", True)
        elif path == "/gzip/bomb":
            self.send_body(200, gzip_bomb(int(query.get("mib", "100"))), "application/octet-stream",
                           extra=[("Content-Encoding", "gzip")])
        elif path == "/loop":
            self.send_json(302, {"loop": True}, extra=[("Location", "/loop")])
        elif path == "/big-header":
            self.send_body(200, b'{"big":true}', extra=[("X-Big", "a" * (1024 * int(query.get("kib", "200"))))])
        elif path == "/many-headers":
            line = "b" * (1024 * int(query.get("kib", "50")))
            count = int(query.get("count", "100"))
            self.send_body(200, b'{"many":true}', extra=[("X-Many-%d" % i, line) for i in range(count)])
        elif path == "/close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif path == "/garbage":
            self.wfile.write(b"SSH-2.0-not-http\r\n\r\n" + b"\x00\xff" * 64)
            self.wfile.flush()
            self.close_connection = True
        else:
            self.send_json(404, {"status": 404, "path": path})

    def send_bytes(self, n, content_type, chunked):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.command == "HEAD":
            return
        chunk = b"\xab" * 65536
        left = n
        while left > 0:
            piece = chunk if left >= len(chunk) else chunk[:left]
            if chunked:
                self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            else:
                self.wfile.write(piece)
            left -= len(piece)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def pages(self, kind, query):
        n = int(query.get("n", "3"))
        per = int(query.get("per", "2"))
        key = query.get("key", kind)
        if kind == "cursor":
            cursor = query.get("cursor", "")
            page = int(cursor[1:]) if cursor.startswith("c") and cursor[1:].isdigit() else 1
        else:
            page = int(query.get("page", "1"))
        counter = "%s:%d" % (key, page)
        with STATS.lock:
            hits = STATS.counters.get(counter, 0) + 1
            STATS.counters[counter] = hits
        if query.get("slow") == str(page):
            if not self.wait(int(query.get("slow_ms", "2000")) / 1000.0, self.path):
                return
        if query.get("fail") == str(page) and hits == 1:
            self.send_json(503, {"page": page, "status": 503})
            return
        items = [{"id": (page - 1) * per + k + 1} for k in range(per)] if 1 <= page <= n else []
        # The other parameters ride along to every page.
        keep = "".join("&%s=%s" % (k, v) for k, v in sorted(query.items()) if k not in ("page", "cursor"))
        host = self.headers.get("Host", "127.0.0.1")
        if kind == "cross":
            name, _, port = host.partition(":")
            host = ("localhost" if name == "127.0.0.1" else "127.0.0.1") + ":" + port
        base = "http://%s/pages/%s" % (host, kind)
        if kind in ("link", "cross"):
            extra = []
            if page < n:
                extra.append(("Link", '<%s?page=%d%s>; rel="next", <%s?page=%d%s>; rel="last"'
                              % (base, page + 1, keep, base, n, keep)))
            self.send_json(200, items, extra=extra)
        elif kind == "url":
            prefix = base if query.get("abs") == "1" else "/pages/url"
            if "next_host" in query:
                prefix = "http://%s:%s/pages/url" % (query["next_host"], host.partition(":")[2])
            nxt = "%s?page=%d%s" % (prefix, page + 1, keep) if page < n else None
            self.send_json(200, {"items": items, "next": nxt})
        elif kind == "cursor":
            self.send_json(200, {"data": {"items": items}, "next_cursor": "c%d" % (page + 1) if page < n else ""})
        else:
            self.send_json(200, {"items": items, "page": page})
    def cache(self, key, query):
        etag = '"%s-v1"' % key
        extra = [("ETag", etag)] if query.get("etag") != "0" else []
        if "age" in query:
            extra.append(("Age", query["age"]))
        if "cc" in query:
            extra.append(("Cache-Control", query["cc"]))
        if "vary" in query:
            extra.append(("Vary", query["vary"]))
        if "delay_ms" in query and not self.wait(int(query["delay_ms"]) / 1000.0, self.path):
            return
        with STATS.lock:
            n = STATS.counters.get(key, 0) + 1
            STATS.counters[key] = n
            if self.headers.get("If-None-Match") == etag:
                STATS.counters[key + ":304"] = STATS.counters.get(key + ":304", 0) + 1
                hit = True
            else:
                hit = False
        if hit:
            self.send_response(304)
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            return
        body = json.dumps({"key": key, "count": n}, separators=(",", ":"))
        size = int(query.get("size", "0"))
        if size > len(body) + 8:
            body = json.dumps({"key": key, "count": n, "pad": "x" * (size - len(body) - 9)}, separators=(",", ":"))
        self.send_body(200, body.encode(), extra=extra)

    def count(self, key, query, path):
        with STATS.lock:
            n = STATS.counters.get(key, 0) + 1
            STATS.counters[key] = n
        if "delay_ms" in query:
            if not self.wait(int(query["delay_ms"]) / 1000.0, path):
                return
        fail = int(query.get("fail", "0"))
        if n <= fail:
            status = int(query.get("fail_status", "503"))
            extra = [("Retry-After", query["retry_after"])] if "retry_after" in query else []
            self.send_json(status, {"key": key, "count": n, "status": status}, extra=extra)
        else:
            self.send_json(200, {"key": key, "count": n})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        # Clients that reset or vanish (cancellation tests) are expected, not errors.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--exit-on-stdin-eof", action="store_true",
                        help="exit when stdin closes, so the fixture dies with the test process that launched it")
    parser.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate chain")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    args = parser.parse_args()
    if args.exit_on_stdin_eof:
        def watch_stdin():
            while sys.stdin.buffer.read(4096):
                pass
            os._exit(0)
        threading.Thread(target=watch_stdin, daemon=True).start()
    server = Server((args.host, args.port), Handler)
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        context.set_alpn_protocols(["http/1.1"])
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    sys.stdout.write("listening %d\n" % server.server_address[1])
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
