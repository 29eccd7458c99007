"""A soak of `hybrid serve` as a real process: for SOAK_SECONDS, concurrent clients mix good
requests, bad ones, streams read to the end, clients that disconnect while their request waits
or runs, slow readers, and streams abandoned half-way.  No answer may be a 5xx; afterwards no
request runs or waits, every KV block is back, the process has not grown without bound, and a
greedy request gives the same text as before the soak."""

import json
import os
import random
import socket
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="pip install '.[serve]'")

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import Server, model  # noqa: E402,F401 - model: the shared fixture

SOAK_SECONDS = float(os.environ.get("HYBRID_SOAK_SECONDS", "40"))
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "List three colours:", "Water boils at"]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _send(port, body, raw=None, content_type="application/json") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = raw if raw is not None else json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Content-Type: " + content_type.encode() + b"\r\nContent-Length: "
              + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def _status(s: socket.socket) -> int:
    line = s.makefile("rb").readline()
    return int(line.split()[1])


def _client(port, rng, stop, problems, counts):
    while not stop.is_set():
        kind = rng.choice(["good", "stream", "bad", "leave_waiting", "leave_stream", "slow"])
        prompt = rng.choice(PROMPTS)
        try:
            if kind == "good":
                s = _send(port, {"prompt": prompt, "max_tokens": rng.randint(1, 40)})
                code = _status(s)
                ok = code in (200, 429)
            elif kind == "stream":
                s = _send(port, {"prompt": prompt, "max_tokens": rng.randint(1, 40),
                                 "stream": True})
                f = s.makefile("rb")
                code = int(f.readline().split()[1])
                body = f.read().decode()
                ok = code == 429 or (code == 200 and "data: [DONE]" in body)  # (chunked)
            elif kind == "bad":
                raw, ctype = rng.choice([
                    (b"{not json", "application/json"),
                    (b'{"prompt": "hi", "max_tokens": 99999}', "application/json"),
                    (b'{"prompt": "hi", "temperature": 9}', "application/json"),
                    (b'{"prompt": "hi \\ud800"}', "application/json"),
                    (b'{"prompt": "hi"}', "text/plain"),
                    (b'{"prompt": [1e9]}', "application/json")])
                code = _status(_send(port, None, raw, ctype))
                ok = 400 <= code < 500
            elif kind == "leave_waiting":  # leave before any answer
                s = _send(port, {"prompt": prompt, "max_tokens": 200})
                time.sleep(rng.uniform(0.0, 0.5))
                s.close()
                code, ok = 0, True
            elif kind == "leave_stream":  # read a few events, then leave
                s = _send(port, {"prompt": prompt, "max_tokens": 300, "stream": True})
                f = s.makefile("rb")
                for _ in range(rng.randint(1, 12)):
                    f.readline()
                s.close()
                code, ok = 0, True
            else:  # a slow reader: a line every 50 ms for a while, then gone
                s = _send(port, {"prompt": prompt, "max_tokens": 300, "stream": True})
                f = s.makefile("rb")
                for _ in range(rng.randint(5, 30)):
                    f.readline()
                    time.sleep(0.05)
                s.close()
                code, ok = 0, True
            counts[kind] = counts.get(kind, 0) + 1
            if not ok or code >= 500:
                problems.append((kind, code))
        except OSError as exc:  # the server closing a connection it refused is fine
            if kind in ("good", "stream", "bad"):
                problems.append((kind, repr(exc)))


def test_soak(model):  # noqa: F811
    srv = Server("--max-batch", "4", "--max-queue", "16", "--max-model-len", "512",
                 "--kv-memory", "16MiB", "--max-body-bytes", "65536")
    try:
        greedy = {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
        code, text, _ = srv.request("POST", "/v1/completions", greedy)
        assert code == 200
        before = json.loads(text)["choices"][0]["text"]
        rss0 = _rss_mib(srv.proc.pid)
        stop, problems, counts = threading.Event(), [], {}
        rng = random.Random(int(os.environ.get("HYBRID_TEST_SEED", "7")))
        clients = [threading.Thread(target=_client, daemon=True,
                                    args=(srv.port, random.Random(rng.random()), stop, problems,
                                          counts))
                   for _ in range(8)]
        for t in clients:
            t.start()
        time.sleep(SOAK_SECONDS)
        stop.set()
        for t in clients:
            t.join(timeout=120)
        assert not problems, problems[:10]
        assert sum(counts.values()) > 50, counts
        deadline = time.time() + 20
        while time.time() < deadline and (srv.metric("hybrid_requests_running")
                                          or srv.metric("hybrid_requests_waiting")
                                          or srv.metric("hybrid_kv_blocks_used")):
            time.sleep(0.2)
        assert srv.metric("hybrid_requests_running") == 0
        assert srv.metric("hybrid_requests_waiting") == 0
        assert srv.metric("hybrid_kv_blocks_used") == 0
        assert srv.metric("hybrid_requests_aborted_total") > 0
        grown = _rss_mib(srv.proc.pid) - rss0
        assert grown < 256, f"the server grew by {grown:.0f} MiB"
        code, text, _ = srv.request("POST", "/v1/completions", greedy)
        assert code == 200 and json.loads(text)["choices"][0]["text"] == before
        print(f"soak: {counts}, grew {grown:.0f} MiB")
    finally:
        srv.stop()
