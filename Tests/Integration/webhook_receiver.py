"""A webhook receiver for events.test.sh, on 127.0.0.1 (or the address given).

Every request is appended to LOG as one JSON line: path, headers (lowercase names), body (text) and the status
answered. A path /fail/N answers 500 to its first N requests, then 200; every other path answers 200.
The first line on stdout is `listening <port>`.

    python3 webhook_receiver.py LOG [HOST]
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = sys.argv[1]
HOST = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
lock = threading.Lock()
seen = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        with lock:
            count = seen.get(self.path, 0)
            seen[self.path] = count + 1
            status = 200
            if self.path.startswith("/fail/"):
                status = 500 if count < int(self.path.split("/")[2].split("?")[0]) else 200
            with open(LOG, "a") as f:
                f.write(json.dumps({"path": self.path, "status": status, "body": body,
                                    "headers": {k.lower(): v for k, v in self.headers.items()}}) + "\n")
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


server = ThreadingHTTPServer((HOST, 0), Handler)
print("listening", server.server_address[1], flush=True)
server.serve_forever()
