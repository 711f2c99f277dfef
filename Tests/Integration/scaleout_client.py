"""JSON over HTTP for the scale-out scripts' Python parts (scaleout*.test.sh), run from the repository root:
    sys.path.insert(0, "Tests/Integration"); from scaleout_client import call, fail, wait_upstream
"""
import json
import sys
import time
import urllib.error
import urllib.request


def call(method, url, body=None):
    """(status, parsed JSON answer or None) of one request with a JSON body, at most 60 s."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def fail(message):
    """Prints the problem and ends the Python part with status 1."""
    print(message, file=sys.stderr)
    sys.exit(1)


def wait_upstream(upstream, test, seconds=10):
    """The upstream fixture's /stats once test(stats) holds, long-polling /stats for its next change between looks;
    None if it does not hold within `seconds`."""
    deadline = time.monotonic() + seconds
    stats = call("GET", upstream + "/stats")[1]
    for _ in range(100000):
        if test(stats):
            return stats
        left = deadline - time.monotonic()
        if left <= 0:
            break
        stats = call("GET", "%s/stats?after=%d&wait=%.1f" % (upstream, stats["generation"], min(left, 30)))[1]
    return None
