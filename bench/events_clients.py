"""Many clients following one job, for bench/65-events.sh: Server-Sent Events streams or long-polls.

    python3 events_clients.py sse|poll HOST PORT JOB_ID CLIENTS

Opens CLIENTS connections at once (asyncio, one thread), waits until every one is following the job, prints
`ready`, then follows it until it settles. Prints one JSON line: clients, messages received (SSE events, or
long-poll answers), bytes, and the seconds from `ready` until the last client finished.
"""
import asyncio
import json
import re
import sys
import time

mode, host, port, job, clients = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
VERSION = re.compile(rb'"version":(\d+)')
STATE = re.compile(rb'"state":"([a-z]+)"')
ready_count = 0
all_ready = asyncio.Event()
totals = {"messages": 0, "bytes": 0}


def note_ready():
    global ready_count
    ready_count += 1
    if ready_count == clients:
        print("ready", flush=True)
        all_ready.set()


async def sse():
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    writer.write(f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head
    note_ready()
    messages = 0
    size = 0
    while True:
        # Chunked: a size line, the chunk, CRLF; the last chunk is size 0.
        line = await reader.readuntil(b"\r\n")
        n = int(line.strip(), 16)
        if n == 0:
            break
        chunk = await reader.readexactly(n + 2)
        size += n
        messages += chunk.count(b"event: ")
    writer.close()
    totals["messages"] += messages
    totals["bytes"] += size


async def poll():
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    since = None
    first = True
    messages = 0
    size = 0
    while True:
        query = "wait=0" if since is None else f"wait=30&since={since}"
        writer.write(f"GET /v1/jobs/{job}?{query} HTTP/1.1\r\nHost: b\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
        body = await reader.readexactly(length)
        if first:
            first = False
            note_ready()
            await all_ready.wait()
        else:
            messages += 1
            size += length
        since = int(VERSION.search(body).group(1))
        if STATE.search(body).group(1) in (b"succeeded", b"failed", b"cancelled"):
            break
    writer.close()
    totals["messages"] += messages
    totals["bytes"] += size


async def main():
    tasks = [asyncio.create_task(sse() if mode == "sse" else poll()) for _ in range(clients)]
    await all_ready.wait()
    start = time.monotonic()
    await asyncio.gather(*tasks)
    print(json.dumps({"clients": clients, "messages": totals["messages"], "bytes": totals["bytes"],
                      "seconds": round(time.monotonic() - start, 3)}), flush=True)


asyncio.run(main())
