"""`hybrid serve` as a real process over real HTTP, driven by the official openai client (and
plain HTTP for what the client hides): completions and chat, streaming, stop strings, usage,
greedy output equal to Model.generate, bad requests, API keys, the queue limit, disconnects,
metrics, and a clean shutdown on SIGTERM."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi", reason="pip install '.[serve]'")
pytest.importorskip("uvicorn", reason="pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is a test dependency")

import hybrid  # noqa: E402
from hybrid.models import ModelLoadError, load_model  # noqa: E402

NAME = "smollm2-135m-instruct"
HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args, env=None, key=None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = key if key is not None else (args[args.index("--api-key") + 1]
                                                if "--api-key" in args else None)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "hybrid", "serve", "--port",
                                      str(self.port), "--threads", "2", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     text=True, cwd=HERE)  # not the source tree: the install
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited:\n" + "".join(self.lines))
            try:
                self.get("/health", key=self.key)
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        raise RuntimeError("server did not start:\n" + "".join(self.lines))

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def request(self, method, path, body=None, raw=None, key=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        if key:
            req.add_header("authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def get(self, path, key=None):
        status, text, _ = self.request("GET", path, key=key)
        if status != 200:
            raise urllib.error.URLError(f"{status}")
        return text

    def metric(self, name) -> float:
        for line in self.get("/metrics", key=self.key).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise


@pytest.fixture(scope="module")
def model():
    try:
        return load_model()
    except ModelLoadError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def server(model):
    srv = Server("--max-batch", "4", "--max-queue", "64", "--max-model-len", "2048")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_completions_equal_generate(client, model):
    prompt = "The capital of France is"
    ids = model.tokenizer.encode(prompt)
    want = model.generate(ids, 12)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == model.tokenizer.decode(want)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(ids) + 12 and r.choices[0].finish_reason == "length"
    r2 = client.completions.create(model=NAME, prompt=ids, max_tokens=12, temperature=0)
    assert r2.choices[0].text == r.choices[0].text  # token ids as the prompt


def test_streaming_chat_and_stop_strings(client, model):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    full = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=24,
                                          temperature=0)
    text = full.choices[0].message.content
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=24,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(msgs),
                                 add_special_tokens=False)
    assert full.usage.prompt_tokens == len(ids)
    stop = text.split()[2]  # a word from the middle of the answer
    cut = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=24,
                                         temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=NAME, messages=msgs, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert streamed == cut.choices[0].message.content


def test_sixteen_concurrent_streams_each_as_alone(client, model):
    prompts = [f"Write the number {i} in words:" for i in range(16)]
    want = [model.tokenizer.decode(model.generate(model.tokenizer.encode(p), 10))
            for p in prompts]  # the server stops at end-of-sequence as generate does
    got = [None] * len(prompts)

    def ask(i):
        got[i] = "".join(c.choices[0].text for c in client.completions.create(
            model=NAME, prompt=prompts[i], max_tokens=10, temperature=0, stream=True))
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


@pytest.mark.parametrize("body,status,needle", [
    (None, 400, "not valid JSON"),
    ({"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": "hi", "temperature": 7}, 400, "temperature"),
    ({"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"prompt": "hi", "model": "gpt-9"}, 404, "gpt-9"),
    ({"prompt": []}, 400, "prompt"),
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "n": 17}, 400, "n"),
    ({"prompt": [1] * 9000}, 400, "context"),
    ({"prompt": [1] * 2048}, 400, "the model's context is 2048"),  # --max-model-len
    ({"prompt": [10**9]}, 400, "token ids"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": [False, 3]}, 400, "prompt"),  # JSON types as documented: no coercion
    ({"prompt": "hi", "max_tokens": "16"}, 400, "max_tokens"),
    ({"prompt": "hi", "stream": 1}, 400, "stream"),
    ({"prompt": [1.5]}, 400, "prompt"),
    ({"prompt": [-7, 39783738247642363640969298968576]}, 400, "prompt"),  # was a 500
    ({"prompt": "hi", "logprobs": 6}, 400, "logprobs"),
    ({"prompt": "hi", "response_format": {"type": "xml"}}, 400, "response_format"),
    ({"prompt": "hi", "best_of": 2}, 400, "'best_of'"),
    ({"prompt": "hi", "min_p": 1.5}, 400, "min_p"),
    ({"prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"999999999": 1}}, 400, "logit_bias names token"),
    ({"prompt": "hi", "echo": True, "logprobs": 2}, 400, "echo with logprobs"),
])
def test_bad_requests_get_4xx_json(server, body, status, needle):
    raw = b"{not json" if body is None else None
    code, text, _ = server.request("POST", "/v1/completions", body, raw=raw)
    assert code == status, text
    err = json.loads(text)["error"]
    assert needle in err["message"] and err["type"]
    code, text, _ = server.request("POST", "/v1/chat/completions", {"messages": []})
    assert code == 400 and "messages" in json.loads(text)["error"]["message"]
    code, text, _ = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 2  # it carries on


@pytest.mark.parametrize("messages,needle", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "only text content parts are supported, got 'image_url'"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages.0.content"),
    ([{"role": "wizard", "content": "hi"}], "messages.0.role"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "only assistant messages carry"),
    ([{"role": "tool", "content": "5"}], "a tool message needs tool_call_id"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}], "arguments are not a JSON string"),
])
def test_bad_chat_messages_get_4xx_json(server, messages, needle):
    code, text, _ = server.request("POST", "/v1/chat/completions", {"messages": messages})
    assert code == 400 and needle in json.loads(text)["error"]["message"], text
    code, text, _ = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 2})
    assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("method,path,raw,status", [
    ("POST", "/v1/completions", b"\xff\x11*yjg\xfe", 400),  # not UTF-8: the framework refuses it
    ("GET", "/v1/nowhere", None, 404),
    ("GET", "/v1/completions", None, 405),
])
def test_framework_errors_get_the_same_error_body(server, method, path, raw, status):
    code, text, _ = server.request(method, path, raw=raw)
    assert code == status, text
    err = json.loads(text)["error"]
    assert err["message"] and err["type"] == "invalid_request_error"


def test_openapi_schema_documents_the_errors_it_sends(server):
    """Clients generated from /openapi.json see what the server does: 400 (not FastAPI's 422)
    with the OpenAI error body, Prometheus text for /metrics, non-empty prompts and messages."""
    code, text, _ = server.request("GET", "/openapi.json")
    assert code == 200
    doc = json.loads(text)
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"200", "400", "404", "429", "503"} <= set(responses)
        assert "401" not in responses  # this server has no API key
        assert {"application/json", "text/event-stream"} <= set(responses["200"]["content"])
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorResponse")
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    schemas = doc["components"]["schemas"]
    assert set(schemas["ErrorResponse"]["properties"]) == {"error"}
    assert {s.get("minLength", s.get("minItems")) for s in
            schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]} == {1}
    assert schemas["ChatRequest"]["properties"]["messages"]["minItems"] == 1


def test_disconnect_mid_stream_frees_blocks(server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": "Once upon a time", "max_tokens": 2000, "stream": True}),
        {"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.readline()  # the first event
    assert server.metric("hybrid_requests_running") == 1
    conn.close()  # the client goes away mid-stream (2000 tokens would take many seconds)
    deadline = time.time() + 3
    while time.time() < deadline and server.metric("hybrid_kv_blocks_used") > 0:
        time.sleep(0.1)
    assert server.metric("hybrid_kv_blocks_used") == 0
    assert server.metric("hybrid_requests_running") == 0


def test_metrics_and_request_log(server, client):
    client.completions.create(model=NAME, prompt="Hello", max_tokens=3, temperature=0)
    text = server.get("/metrics")
    for name in ("hybrid_requests_running", "hybrid_requests_waiting", "hybrid_kv_blocks_used",
                 "hybrid_kv_blocks_total", "hybrid_prefix_cache_hit_tokens_total",
                 "hybrid_prompt_tokens_total", "hybrid_generation_tokens_total",
                 "hybrid_time_to_first_token_seconds_bucket",
                 "hybrid_time_per_output_token_seconds_bucket"):
        assert name in text
    assert server.metric("hybrid_generation_tokens_total") >= 3
    assert any("prompt=" in line and "ttft=" in line and "tok/s" in line for line in server.lines)


def test_api_key_queue_limit_and_clean_shutdown(model):
    srv = Server("--api-key", "sesame", "--max-queue", "1", "--max-batch", "1")
    try:
        code, text, _ = srv.request("GET", "/v1/models")
        assert code == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
        assert srv.request("POST", "/v1/completions", {"prompt": "hi"})[0] == 401
        assert srv.request("GET", "/v1/models", key="wrong")[0] == 401
        assert srv.request("GET", "/v1/models", key="sesame")[0] == 200
        doc = json.loads(srv.request("GET", "/openapi.json", key="sesame")[1])
        assert "401" in doc["paths"]["/v1/models"]["get"]["responses"]
        assert "401" in doc["paths"]["/v1/completions"]["post"]["responses"]
        assert srv.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                           key="sesame")[0] == 200
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sesame", max_retries=0)
        codes = []

        def ask():
            try:
                client.completions.create(model=NAME, prompt="Tell me a story", max_tokens=40)
                codes.append(200)
            except openai.RateLimitError:
                codes.append(429)
        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 429 in codes and 200 in codes
        assert srv.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                           key="sesame")[0] == 200  # after the 429s, served again
        # a stream running at shutdown ends; the process exits promptly
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Once", "max_tokens": 3000, "stream": True}),
            {"content-type": "application/json", "authorization": "Bearer sesame"})
        resp = conn.getresponse()
        resp.readline()
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        rest = resp.read().decode()
        # uvicorn re-raises the signal once it has shut down cleanly
        assert srv.proc.wait(timeout=30) in (0, -signal.SIGTERM) and time.time() - t0 < 30
        assert '"error"' in rest and rest.rstrip().endswith("data: [DONE]")
    finally:
        srv.stop()


def test_penalties_and_logit_bias(client, model):
    """presence_penalty, frequency_penalty and logit_bias reach the sampler: greedy answers equal
    Model.generate with the same parameters."""
    prompt = "The capital of France is"
    ids = model.tokenizer.encode(prompt)
    kw = dict(presence_penalty=0.6, frequency_penalty=1.1)
    want = model.generate(ids, 10, **kw)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=10, temperature=0, **kw)
    assert r.choices[0].text == model.tokenizer.decode(want)
    tok = model.tokenizer.encode(" Paris")[-1]
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=3, temperature=0,
                                  logit_bias={str(tok): 100})
    assert r.choices[0].text == model.tokenizer.decode([tok] * 3)


def test_logprobs_chat_completions_and_streams(client, model):
    """logprobs / top_logprobs (chat) and logprobs (completions) report each generated token's
    log-probability and the most likely alternatives, equal to the model's own log-softmax."""
    import numpy as np

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token  # greedy: the most likely
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
    ids = model.tokenizer.encode_chat(msgs)
    x = model.logits(ids).astype(np.float64)
    lsm = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    assert abs(content[0].logprob - lsm.max()) < 1e-6
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6,
                                                 temperature=0, logprobs=True, stream=True))
    streamed = [i for c in chunks if c.choices and c.choices[0].logprobs
                for i in c.choices[0].logprobs.content]
    assert [i.token for i in streamed] == [i.token for i in content]
    r = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert all(len(t) == 2 for t in lp.top_logprobs)
