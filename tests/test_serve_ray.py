"""`hybrid serve --ray`: replicas of the server as a Ray Serve application on a local Ray cluster,
over real HTTP through Ray's proxy, driven by the openai client."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("ray", reason="pip install '.[ray]'")
pytest.importorskip("fastapi", reason="pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is a test dependency")

from hybrid.models import ModelLoadError, load_model  # noqa: E402
from test_serve import NAME, Server, _free_port  # noqa: E402


def test_two_replicas_behind_rays_proxy(tmp_path):
    try:
        model = load_model()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hybrid", "serve", "--ray", "--replicas", "2",
                             "--threads", "1", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=os.path.dirname(__file__))
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    srv = Server.__new__(Server)
    srv.port, srv.url, srv.proc, srv.lines = port, f"http://127.0.0.1:{port}", proc, lines
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, "".join(lines)[-3000:]
            assert time.time() < deadline, "Ray Serve did not come up:\n" + "".join(lines)[-3000:]
            try:
                if srv.request("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        ids = model.tokenizer.encode("The capital of France is")
        want = model.tokenizer.decode(model.generate(ids, 8))
        raw = client.completions.with_raw_response.create(
            model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0)
        assert raw.parse().choices[0].text == want
        assert raw.headers.get("x-hybrid-replica")
        prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(8)]
        want = [model.tokenizer.decode(model.generate(model.tokenizer.encode(p), 6))
                for p in prompts]
        got, seen = [None] * 8, []

        def ask(i):
            r = client.completions.with_raw_response.create(model=NAME, prompt=prompts[i],
                                                            max_tokens=6, temperature=0)
            got[i] = r.parse().choices[0].text
            seen.append(r.headers["x-hybrid-replica"])
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want  # 8 concurrent requests, each answered as alone
        for _ in range(30):  # Ray routes by queue length: more requests until both have served
            if len(set(seen)) >= 2:
                break
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert len(set(seen)) == 2, seen  # both replicas served
        code, text, _ = srv.request("POST", "/v1/completions", {"prompt": "hi", "top_p": 0})
        assert code == 400 and "top_p" in text  # errors come back through the proxy as they are
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
