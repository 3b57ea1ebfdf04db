"""A TCP proxy in front of a Kafka-protocol broker that counts the requests passing through,
by client id and request kind: the broker round trips a piece of code costs, counted on the
wire (every request librdkafka sends, metadata, coordinator look-ups and fetches included),
not by what the code believes it asked for.

The broker advertises the proxy's address, so every connection a client opens (bootstrap
and the connections the metadata names) goes through it. It runs as its own process (its
relaying never competes with the measured process for the GIL); ``CountingProxy.counts()``
asks it for the totals so far over a pipe.

    python -m tests.stream.kafka_proxy LISTEN_PORT UPSTREAM_PORT
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import threading
from collections import Counter

API = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
       10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
       15: "DescribeGroups", 16: "ListGroups", 17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics",
       22: "InitProducerId", 32: "DescribeConfigs", 36: "SaslAuthenticate", 42: "DeleteGroups", 60: "DescribeCluster",
       71: "GetTelemetrySubscriptions", 72: "PushTelemetry"}


def parse_requests(buf: bytearray, counts: Counter) -> None:
    """Count the complete request frames at the head of ``buf`` and remove them: a frame is a
    4-byte size, then api key (int16), version (int16), correlation id (int32) and the client
    id (int16 length + bytes) of the request header."""
    while len(buf) >= 4:
        size = struct.unpack_from(">i", buf)[0]
        if len(buf) < 4 + size:
            return
        key = struct.unpack_from(">h", buf, 4)[0]
        n = struct.unpack_from(">h", buf, 12)[0] if size >= 10 else -1
        client = bytes(buf[14:14 + n]).decode(errors="replace") if n > 0 else ""
        counts[(client, API.get(key, f"api{key}"))] += 1
        del buf[:4 + size]


async def _pipe(reader, writer, counts: Counter | None) -> None:
    buf = bytearray()
    try:
        while data := await reader.read(65536):
            writer.write(data)
            if counts is not None:
                buf += data
                parse_requests(buf, counts)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(listen: int, upstream: int, counts: Counter) -> None:
    async def handle(client_r, client_w):
        try:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, broker_w, counts), _pipe(broker_r, client_w, None))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    loop = asyncio.get_running_loop()

    def control():  # one line in -> the totals so far out, as JSON
        for _ in sys.stdin:
            out = {}
            for (client, kind), n in list(counts.items()):
                out.setdefault(client, {})[kind] = n
            print(json.dumps(out), flush=True)
        loop.call_soon_threadsafe(server.close)

    threading.Thread(target=control, daemon=True).start()
    print("ready", flush=True)
    async with server:
        try:
            await server.serve_forever()
        except asyncio.CancelledError:
            pass


class CountingProxy:
    """The proxy process: ``counts()`` gives {client id: {request kind: requests so far}}."""

    def __init__(self, listen: int, upstream: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.stream.kafka_proxy", str(listen), str(upstream)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the counting proxy did not start")

    def counts(self) -> dict[str, dict[str, int]]:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def requests_between(before: dict, after: dict, client: str) -> dict[str, int]:
    """Requests of ``client`` by kind between two ``counts()`` (kinds with none left out)."""
    b, a = before.get(client, {}), after.get(client, {})
    return {k: a[k] - b.get(k, 0) for k in sorted(a) if a[k] - b.get(k, 0)}


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2]), Counter()))
