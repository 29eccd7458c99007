"""`hybrid serve` as a real process, driven by the official openai client: structured outputs
(chat.completions.parse with a Pydantic model, json_schema, structured_outputs), tool calls
(forced, streamed as delta.tool_calls, results sent back), n choices, echo, /tokenize,
/detokenize and /v1/embeddings."""

import base64
import json
import os
import re
import sys

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="pip install '.[serve]'")
pytest.importorskip("llguidance", reason="pip install '.[structured]'")
openai = pytest.importorskip("openai", reason="the openai client is a test dependency")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import NAME, Server, model  # noqa: E402,F401 - model: the shared fixture
from test_structured import SCHEMA, TOOLS  # noqa: E402


@pytest.fixture(scope="module")
def server(model):  # noqa: F811
    srv = Server("--max-batch", "8", "--max-queue", "32", "--max-model-len", "2048")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population: int = pydantic.Field(ge=0, le=100_000_000)


def test_parse_with_a_pydantic_model(client):
    for seed in (0, 1, 2):
        r = client.chat.completions.parse(
            model=NAME, messages=[{"role": "user", "content": "Describe Paris as JSON."}],
            response_format=City, max_tokens=100, temperature=0.8, seed=seed)
        assert r.choices[0].finish_reason == "stop"
        city = r.choices[0].message.parsed
        assert isinstance(city, City) and city.population >= 0


def test_json_schema_and_structured_outputs(client, server):
    for seed in (3, 4):
        r = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "A person as JSON"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
            max_tokens=150, temperature=0.9, seed=seed)
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    for extra, check in [({"regex": r"[0-9]{3}-[0-9]{4}"},
                          lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
                         ({"choice": ["cat", "dog"]}, lambda t: t in ("cat", "dog")),
                         ({"grammar": 'root ::= "x=" [0-9]+ ";"'},
                          lambda t: re.fullmatch(r"x=[0-9]+;", t)),
                         ({"json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                    "required": ["ok"], "additionalProperties": False}},
                          lambda t: json.loads(t) in ({"ok": True}, {"ok": False}))]:
        r = client.completions.create(model=NAME, prompt="Answer: ", max_tokens=24,
                                      temperature=0.9, seed=5,
                                      extra_body={"structured_outputs": extra})
        assert check(r.choices[0].text), (extra, r.choices[0].text)
    # a schema or grammar that cannot be compiled: a 400 naming the problem
    for body, param in [({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "wat"}}}}, "response_format"),
            ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
            ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
            ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, None)]:
        status, text, _ = server.request("POST", "/v1/chat/completions", dict(
            model=NAME, messages=[{"role": "user", "content": "x"}], **body))
        err = json.loads(text)["error"]
        assert status == 400, text
        assert param is None or err["param"] == param, err
    status, text, _ = server.request("POST", "/v1/chat/completions", dict(
        model=NAME, messages=[{"role": "user", "content": "x"}],
        structured_outputs={"xml": "<a/>"}))
    assert status == 400 and "xml" in text


def test_forced_and_streamed_tool_calls(client):
    msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    r = client.chat.completions.create(
        model=NAME, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0.7, seed=1,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    (call,) = msg.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), schemas["get_weather"])
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(
            model=NAME, messages=msgs, tools=TOOLS, tool_choice="required", max_tokens=80,
            temperature=0.7, seed=2, parallel_tool_calls=False, stream=True):
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
            c["id"] = c["id"] or tc.id
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    c = calls[0]
    assert c["id"].startswith("call_")
    jsonschema.validate(json.loads(c["arguments"]), schemas[c["name"]])
    # the call and its result go back; the model answers in text
    back = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]}}]},
        {"role": "tool", "tool_call_id": c["id"], "content": '{"temperature": 4}'}]
    r = client.chat.completions.create(model=NAME, messages=back, tools=TOOLS,
                                       tool_choice="none", max_tokens=16, temperature=0)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None


def test_n_choices_share_the_prompt(client, server):
    prompt = "Once upon a time, " * 40  # several full KV blocks
    hits = server.metric("hybrid_prefix_cache_hit_tokens_total")
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, n=4,
                                  temperature=1.0, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == len(server_tokens(server, prompt))  # the prompt once
    assert 4 <= r.usage.completion_tokens <= 32
    assert len({c.text for c in r.choices}) > 1  # seeds seed, seed+1, ...
    assert server.metric("hybrid_prefix_cache_hit_tokens_total") - hits >= 3 * 64
    chunks = list(client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=6,
        temperature=0, stream=True))
    texts = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(texts) == [0, 1, 2] and len(set(texts.values())) == 1  # greedy: all alike


def server_tokens(server, text):
    status, body, _ = server.request("POST", "/tokenize", {"prompt": text,
                                                            "add_special_tokens": False})
    return json.loads(body)["tokens"]


def test_echo_tokenize_detokenize(client, server, model):
    r = client.completions.create(model=NAME, prompt="The capital of France is", echo=True,
                                  max_tokens=4, temperature=0)
    plain = client.completions.create(model=NAME, prompt="The capital of France is",
                                      max_tokens=4, temperature=0)
    assert r.choices[0].text == "The capital of France is" + plain.choices[0].text
    status, text, _ = server.request("POST", "/v1/completions", {
        "model": NAME, "prompt": "x", "echo": True, "logprobs": 1})
    assert status == 400 and "echo with logprobs" in text
    ids = model.tokenizer.encode("hello world, again")
    status, text, _ = server.request("POST", "/tokenize", {"prompt": "hello world, again"})
    body = json.loads(text)
    assert status == 200 and body["tokens"] == ids and body["count"] == len(ids)
    msgs = [{"role": "user", "content": "hi"}]
    status, text, _ = server.request("POST", "/tokenize", {"messages": msgs})
    assert json.loads(text)["tokens"] == model.tokenizer.encode_chat(msgs)
    status, text, _ = server.request("POST", "/detokenize", {"tokens": ids})
    assert status == 200 and json.loads(text)["prompt"] == model.tokenizer.decode(ids)
    status, text, _ = server.request("POST", "/detokenize", {"tokens": [10 ** 9]})
    assert status == 400 and json.loads(text)["error"]["param"] == "tokens"
    status, text, _ = server.request("POST", "/tokenize", {"prompt": "a", "messages": msgs})
    assert status == 400


def test_embeddings(client, model, server):
    texts = ["The cat sat on the mat.", "A dog barked."]
    r = client.embeddings.create(model=NAME, input=texts)
    assert [d.index for d in r.data] == [0, 1]
    for d, t in zip(r.data, texts):
        want = model.embedding(model.tokenizer.encode(t))
        assert np.abs(np.asarray(d.embedding) - want).max() < 1e-6
    assert r.usage.prompt_tokens == sum(len(model.tokenizer.encode(t)) for t in texts)
    r = client.embeddings.create(model=NAME, input="hi", encoding_format="base64")
    vec = np.frombuffer(base64.b64decode(r.data[0].embedding), dtype="<f4")
    assert np.abs(vec - model.embedding(model.tokenizer.encode("hi"))).max() < 1e-6
    status, text, _ = server.request("POST", "/v1/embeddings", {"input": "x", "dimensions": 8})
    assert status == 400 and "dimensions" in text
    status, text, _ = server.request("POST", "/v1/embeddings", {"input": "x",
                                                                 "pooling": "mean"})
    got = np.asarray(json.loads(text)["data"][0]["embedding"])
    assert np.abs(got - model.embedding(model.tokenizer.encode("x"), "mean")).max() < 1e-6


def test_openapi_lists_what_is_accepted(server):
    spec = json.loads(server.get("/openapi.json"))
    chat = json.dumps(spec["components"]["schemas"]["ChatRequest"])
    for field in ("response_format", "structured_outputs", "tools", "tool_choice",
                  "parallel_tool_calls", "logprobs", "top_logprobs", "n", "logit_bias"):
        assert f'"{field}"' in chat, field
    assert "/tokenize" in spec["paths"] and "/v1/embeddings" in spec["paths"]
