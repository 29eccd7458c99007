"""Constrained decoding and tool calls on the embedded SmolLM2, without the server: masks against
a reference written here, every constraint kind sampled at temperature > 0 over several seeds
and checked by an independent validator (jsonschema, re), constrained greedy output alone and in
a crowd of 16, tool-call formats read back, and Model.chat."""

import json
import re

import numpy as np
import pytest

pytest.importorskip("llguidance", reason="pip install '.[structured]'")
jsonschema = pytest.importorskip("jsonschema", reason="a test dependency")

from hybrid import Engine, GenerationParams  # noqa: E402
from hybrid.chat import plan_chat  # noqa: E402
from hybrid.models import ModelLoadError, load_model  # noqa: E402
from hybrid.structured import Constraint  # noqa: E402
from hybrid.toolcalls import FORMATS, ToolStream, format_for  # noqa: E402

SEEDS = (0, 1, 2, 3)
SCHEMA = {
    "type": "object",
    "$defs": {"tag": {"type": "string", "enum": ["red", "green", "blue"]}},
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1,
                 "maxItems": 3},
    },
    "required": ["name", "age", "score", "tags"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def model():
    try:
        return load_model()
    except ModelLoadError as exc:
        pytest.skip(str(exc))


def _chat_ids(model, text):
    return model.tokenizer.encode_chat([{"role": "user", "content": text}])


def _sampled(model, prompt, constraint, n_tokens=96, seeds=SEEDS, finished=True):
    """The texts sampled at temperature 0.9, one per seed (with ``finished``: each must have
    ended because the constraint was complete, not at the token limit)."""
    ids = _chat_ids(model, prompt)
    engine = Engine(model, max_batch=len(seeds), kv_memory="128MiB")
    rids = [engine.add_request(ids, GenerationParams(n_tokens, temperature=0.9, seed=s,
                                                     constraint=constraint)) for s in seeds]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.text, out.finish_reason)
    if finished:
        assert all(done[r][1] == "stop" for r in rids), [done[r] for r in rids]
        return [done[r][0] for r in rids]
    return [done[r] for r in rids]


def test_choice_mask_against_a_reference(model):
    """The allowed next tokens are exactly those whose text keeps the output a prefix of a
    choice (end of sequence: only once the output is a whole choice)."""
    tok = model.tokenizer
    choices = ["sunny", "sun", "rainy day", "snow"]
    m = Constraint("choice", choices).matcher(tok, model.vocab_size)
    texts = [tok.decode([t]) for t in range(model.vocab_size)]
    special = set(tok.eos_ids)
    done = ""
    for step in ("sun", "ny"):  # the prefix "", then "sun" (a whole choice), then "sunny"
        allowed = m.allowed()
        want = np.array([t not in special and bool(texts[t]) and "\ufffd" not in texts[t]
                         and any(c.startswith(done + texts[t]) for c in choices)
                         for t in range(model.vocab_size)])
        for e in special:
            want[e] = done in choices
        assert (allowed == want).all(), (done, np.flatnonzero(allowed != want)[:10])
        for t in tok.encode(step, add_special_tokens=False):
            m.accept(t)
        done += step
    allowed = m.allowed()  # "sunny" is whole, and no choice goes on: only the end remains
    assert set(np.flatnonzero(allowed)) <= special and allowed[list(special)].any()
    with pytest.raises(ValueError, match="breaks the constraint"):
        m.accept(tok.encode("x", add_special_tokens=False)[0])


def test_json_schema_sampled_outputs_validate(model):
    outs = _sampled(model, "Describe a person as JSON.", Constraint("json_schema", SCHEMA), 120)
    for text in outs:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(outs)) > 1  # sampling still varies within the schema


def test_json_object_regex_choice_and_grammars(model):
    # any JSON object may run past the token limit inside a string; those that end are objects
    ended = [t for t, why in _sampled(model, "Give me a small JSON object.",
                                      Constraint("json_object"), 80, range(8), False)
             if why == "stop"]
    assert len(ended) >= 2 and all(isinstance(json.loads(t), dict) for t in ended)
    pattern = r"[A-Z][a-z]{2,8}-[0-9]{2,4}"
    for text in _sampled(model, "A product code:", Constraint("regex", pattern), 24):
        assert re.fullmatch(pattern, text), text
    choices = ["positive", "negative", "neutral"]
    for text in _sampled(model, "Sentiment of 'I love it':", Constraint("choice", choices), 8):
        assert text in choices
    lark = 'start: "The answer is " NUM "."\nNUM: /[0-9]{1,3}/'
    for text in _sampled(model, "What is 6 times 7?", Constraint("grammar", lark), 16):
        assert re.fullmatch(r"The answer is [0-9]{1,3}\.", text), text
    gbnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c]'
    for text in _sampled(model, "A tuple:", Constraint("grammar", gbnf), 24):
        assert re.fullmatch(r"\([a-c](,[a-c])*\)", text), text


@pytest.mark.parametrize("kind,value,message", [
    ("json_schema", {"type": "wat"}, "json_schema cannot be compiled"),
    ("json_schema", {"$ref": "#/$defs/missing"}, "missing"),
    ("regex", "[a-", "regex cannot be compiled"),
    ("grammar", "root ::= (", "grammar cannot be compiled"),
    ("grammar", "start: undefined_rule", "grammar cannot be compiled"),
])
def test_bad_constraints_name_the_problem(kind, value, message):
    with pytest.raises(ValueError, match=message):
        Constraint(kind, value).check()


def test_constraint_arguments_checked():
    with pytest.raises(ValueError, match="kind must be one of"):
        Constraint("xml", "x")
    with pytest.raises(ValueError, match="choice constraint takes"):
        Constraint("choice", [])
    with pytest.raises(ValueError, match="constraint must be a hybrid.structured.Constraint"):
        GenerationParams(constraint={"type": "json_object"})


def test_constrained_greedy_is_the_same_alone_and_in_a_crowd(model):
    """Constrained greedy output does not depend on what else runs (batch invariance plus a
    mask that depends only on the request's own tokens); a request without a constraint gets
    no matcher and no mask work."""
    c = Constraint("json_schema", SCHEMA)
    prompts = [_chat_ids(model, f"Person number {i} as JSON, please.") for i in range(16)]
    alone = model.generate(prompts[3], 80, constraint=c)
    engine = Engine(model, max_batch=16, kv_memory="256MiB")
    rids = [engine.add_request(p, GenerationParams(80, constraint=c if i % 2 else None,
                                                   detokenize=False))
            for i, p in enumerate(prompts)]
    assert engine._requests[rids[0]].matcher is None
    got = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                got[out.request_id] = list(out.tokens)
    assert got[rids[3]] == alone
    jsonschema.validate(json.loads(model.tokenizer.decode(alone)), SCHEMA)
    plain = Engine(model, max_batch=2, kv_memory="64MiB")
    plain.generate([prompts[0]], 4)
    assert plain._mask_thread is None  # unconstrained requests pay nothing


def test_logprobs_of_a_constrained_request_are_the_models(model):
    """logprobs report the model's distribution (the raw logits), constrained or not."""
    ids = _chat_ids(model, "Yes or no?")
    want = model.logits(ids).astype(np.float64)
    lsm = want - want.max() - np.log(np.exp(want - want.max()).sum())
    engine = Engine(model, max_batch=1, kv_memory="64MiB")
    engine.add_request(ids, GenerationParams(4, logprobs=2,
                                             constraint=Constraint("choice", ["yes", "no"])))
    first = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.logprobs and first is None:
                first = out.logprobs[0]
    assert abs(first.logprob - lsm[first.token]) < 1e-6
    assert model.tokenizer.decode([first.token]) in ("yes", "no", "y", "n", "ye")


# -- tool calls --------------------------------------------------------------------------------
def test_tool_formats_read_back():
    tools = TOOLS
    h, l3, mi = FORMATS["hermes"], FORMATS["llama3"], FORMATS["mistral"]
    text = ('Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
            '"unit": "celsius"}}\n</tool_call>')
    content, calls = h.parse(text, tools)
    assert content == "Let me check.\n"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)
    assert h.parse('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', tools)[1] == []
    assert h.parse("<tool_call>\nnot json\n</tool_call>", tools)[1] == []
    c3 = l3.parse('<|python_tag|>{"name": "add", "parameters": {"a": 5, "b": 6}}', tools)[1]
    assert json.loads(c3[0]["function"]["arguments"]) == {"a": 5, "b": 6}
    cm = mi.parse('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 1}}, '
                  '{"name": "add", "arguments": {"a": 2, "b": 2}}]', tools)[1]
    assert [json.loads(c["function"]["arguments"])["a"] for c in cm] == [1, 2]
    assert format_for("{{ '[TOOL_CALLS]' }}")[0].name == "mistral"
    assert format_for("{% if tools %}<tool_call>{% endif %}") == (h, True)
    assert format_for("{{ '<|python_tag|>' }}")[0].name == "llama3"
    assert format_for(None) == (h, False)


def test_tool_stream_hands_out_content_then_each_call():
    text = ('Checking.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
            '\n<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
    for size in (1, 3, 11):
        s = ToolStream(FORMATS["hermes"], TOOLS)
        pieces = [s.add(text[i:i + size], False) for i in range(0, len(text), size)]
        pieces.append(s.add("", True))
        assert "".join(p for p, _ in pieces) == "Checking."
        calls = [c for _, cs in pieces for c in cs]
        assert [json.loads(c["function"]["arguments"])["a"] for c in calls] == [1, 3]
        # the first call comes out before the second is written
        first = next(i for i, (_, cs) in enumerate(pieces) if cs)
        assert first * size < text.index("<tool_call>", 20) + size
    plain = ToolStream(FORMATS["hermes"], TOOLS)
    got = plain.add("a <tool", False)[0] + plain.add("bar> b", False)[0] + plain.add("", True)[0]
    assert got == "a <toolbar> b"  # held while it could begin a call, then handed out


QWEN_LIKE = ("{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n"
             "{% endfor %}Call with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
             "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
             "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n"
             "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n"
             "</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tools_reach_a_template_that_takes_them(model, monkeypatch):
    tok = model.tokenizer
    monkeypatch.setattr(tok, "chat_template", QWEN_LIKE)
    msgs = [{"role": "user", "content": "Add 2 and 3"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    plan = plan_chat(tok, msgs, tools=TOOLS)
    text = tok.decode(plan.ids, skip_special_tokens=False)
    assert '"name": "get_weather"' in text and "<tool_call>" in text
    assert '{"name": "add", "arguments": {"a": 2, "b": 3}}' in text  # arguments as an object
    assert plan.constraint is None and plan.tools is not None


def test_fallback_prompt_and_forced_calls_validate(model):
    """A template without tools gets them in a system message; "required" and a named choice
    give calls whose arguments validate against the function's schema, at any seed."""
    msgs = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 2?"}]
    plan = plan_chat(model.tokenizer, msgs, tools=TOOLS, tool_choice="required")
    assert "get_weather" in model.tokenizer.decode(plan.ids)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in SEEDS:
        for choice in ("required", {"type": "function", "function": {"name": "add"}}):
            msg = model.chat(msgs, 96, tools=TOOLS, tool_choice=choice, temperature=0.9,
                             seed=seed, parallel_tool_calls=False)
            assert model.last_stats.finish_reason == "tool_calls", msg
            (call,) = msg["tool_calls"]
            name = call["function"]["name"]
            assert choice == "required" or name == "add"
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])
    with pytest.raises(ValueError, match="not among the tools"):
        plan_chat(model.tokenizer, msgs, tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="needs tools"):
        plan_chat(model.tokenizer, msgs, tool_choice="required")
    with pytest.raises(ValueError, match="cannot be combined"):
        plan_chat(model.tokenizer, msgs, tools=TOOLS, tool_choice="required",
                  response_format={"type": "json_object"})


def test_chat_with_response_format(model):
    msg = model.chat([{"role": "user", "content": "A person as JSON"}], 120,
                     response_format={"type": "json_schema",
                                      "json_schema": {"name": "p", "schema": SCHEMA}})
    jsonschema.validate(json.loads(msg["content"]), SCHEMA)
    assert "tool_calls" not in msg


def test_embedding_pools_the_final_hidden_state(model):
    ids = model.tokenizer.encode("The cat sat on the mat.")
    last, mean = model.embedding(ids), model.embedding(ids, "mean")
    assert abs(np.linalg.norm(last) - 1) < 1e-5 and abs(np.linalg.norm(mean) - 1) < 1e-5
    assert np.dot(last, mean) < 0.999  # two poolings, two vectors
    prefix = model.embedding(ids[:3])
    # the last token's state over a prefix is the prefix's own (causal attention)
    x, _ = model._run_layers([model.new_cache()], [np.asarray(ids, dtype=np.int64)], "prompt")
    from hybrid import reference
    h = reference.rmsnorm(np.asarray(x, dtype=np.float64), model.final_norm.astype(np.float64),
                          model.config.rms_norm_eps)
    want = h[2] / np.linalg.norm(h[2])
    assert np.abs(prefix - want).max() < 1e-4
    with pytest.raises(ValueError, match="pooling must be"):
        model.embedding(ids, "max")


def test_a_complete_constraint_ends_the_request(model):
    """Once the constraint allows nothing more the request finishes with "stop", also when the
    end-of-sequence token is not one of its stop tokens."""
    engine = Engine(model, max_batch=1, kv_memory="64MiB")
    rid = engine.add_request(_chat_ids(model, "Pick"), GenerationParams(
        16, stop_tokens=[], constraint=Constraint("choice", ["alpha", "beta"])))
    last = None
    while engine.has_unfinished():
        for out in engine.step():
            last = out
    assert last.request_id == rid and last.finish_reason == "stop", last
    assert last.text in ("alpha", "beta") and len(last.tokens) <= 4


@pytest.mark.parametrize("marker,fmt", [("<tool_call>", "hermes"), ("<|python_tag|>", "llama3"),
                                        ("[TOOL_CALLS]", "mistral")])
def test_forced_calls_in_each_format(model, monkeypatch, marker, fmt):
    """A template's format decides the grammar that forces a call and the reader that finds it:
    forced output in each layout reads back as a call whose arguments validate."""
    template = QWEN_LIKE.replace("<tool_call>", marker)
    monkeypatch.setattr(model.tokenizer, "chat_template", template)
    msgs = [{"role": "user", "content": "Add 40 and 2."}]
    assert format_for(template)[0].name == fmt
    for seed in (0, 1):
        for parallel in (False, True):
            msg = model.chat(msgs, 96, tools=TOOLS, tool_choice="required", temperature=0.8,
                             seed=seed, parallel_tool_calls=parallel)
            assert msg.get("tool_calls"), msg
            assert parallel or len(msg["tool_calls"]) == 1
            for call in msg["tool_calls"]:
                schema = next(t["function"]["parameters"] for t in TOOLS
                              if t["function"]["name"] == call["function"]["name"])
                jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
