"""Tool calls in a model's own format: how tools are offered, how a call is forced, how calls are
read back out of the generated text (whole, or while it streams).

Three formats, chosen from the model's chat template:

- ``hermes`` (Qwen 2.5/3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call.  Also the fallback for a template that knows no tools: the tools are then
  described in a system message (``FALLBACK_PROMPT``) and calls use this layout.
- ``llama3`` (Llama 3.1+): the output is ``{"name": ..., "parameters": {...}}``, calls
  separated by ``;``, optionally after ``<|python_tag|>``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.

A ``tool_choice`` of "required" or a named function becomes a grammar (hybrid.structured) in
which every call's arguments follow that function's JSON schema.
"""

from __future__ import annotations

import json
import re
import uuid

from .structured import Constraint

FALLBACK_PROMPT = (
    "You can call functions to help answer. The functions, as JSON schemas:\n<tools>\n{tools}\n"
    "</tools>\nTo call a function, answer with one block per call:\n<tool_call>\n"
    '{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n</tool_call>')
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def check_tools(tools) -> list:
    """OpenAI's ``tools`` list, checked: [{"type": "function", "function": {"name", ...}}]."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list")
    names = set()
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(f, dict):
            raise ValueError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = f.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ValueError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' "
                             f"or '-', got {name!r}")
        if name in names:
            raise ValueError(f"tools[{i}].function.name {name!r} is given twice")
        names.add(name)
        params = f.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def _parameters(tool) -> dict:
    return tool["function"].get("parameters") or {"type": "object"}


class ToolFormat:
    """One model family's tool-call layout (see the module docstring)."""

    name = "hermes"
    args_key = "arguments"

    # -- the grammar that forces calls --------------------------------------------------------
    def call_schema(self, tools) -> dict:
        """A JSON schema that matches one call of any of ``tools``."""
        one = [{"type": "object",
                "properties": {"name": {"const": t["function"]["name"]},
                               self.args_key: _parameters(t)},
                "required": ["name", self.args_key], "additionalProperties": False}
               for t in tools]
        schema = one[0] if len(one) == 1 else {"anyOf": one}
        return dict(schema, **{"x-guidance": _LAYOUT})

    def constraint(self, tools, parallel: bool) -> Constraint:
        """Output that is one call (or, with ``parallel``, one or more) of ``tools``."""
        obj = json.dumps(self.call_schema(tools))
        more = ' ("\\n" call)*' if parallel else ""
        return Constraint("grammar", f'start: call{more}\n'
                                     f'call: "<tool_call>\\n" obj "\\n</tool_call>"\n'
                                     f'obj: %json {obj}\n')

    # -- reading calls back -------------------------------------------------------------------
    def split(self, text: str) -> "tuple[str, str | None]":
        """(content, the tool-call part or None when the text holds no call)."""
        i = text.find("<tool_call>")
        return (text, None) if i < 0 else (text[:i], text[i:])

    def calls_in(self, part: str) -> "tuple[list, str]":
        """(the calls' JSON objects in a tool-call part, the text left after them: an unclosed
        last block that is not a whole call).  A closed block that is not a JSON object gives
        None in its place."""
        objs, pos = [], 0
        for m in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", part, re.S):
            objs.append(_json_object(m.group(1)))
            pos = m.end()
        rest = part[pos:]
        last = re.fullmatch(r"\s*<tool_call>\s*(.*?)\s*", rest, re.S)
        if last and _json_object(last.group(1)) is not None:
            objs.append(_json_object(last.group(1)))
            rest = ""
        return objs, rest

    def may_start(self, text: str) -> int:
        """How much of the end of ``text`` may be the start of a call (held back while
        streaming)."""
        return _held(text, "<tool_call>")

    def complete_calls(self, part: str) -> int:
        """How many calls in a growing tool-call part are already complete."""
        return part.count("</tool_call>")

    def parse(self, text: str, tools) -> "tuple[str | None, list]":
        """(content or None, OpenAI tool_calls).  Text that looks like a call but is not valid
        JSON of a known function stays content."""
        content, part = self.split(text)
        if part is None:
            return text, []
        names = {t["function"]["name"] for t in tools}
        calls = []
        objs, rest = self.calls_in(part)
        for obj in objs:
            if obj is None or obj.get("name") not in names:
                return text, []
            args = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
            calls.append(tool_call(obj["name"], args))
        if not calls:
            return text, []
        content += rest.strip()  # a call cut short (finish "length") stays text
        return (content if content.strip() else None), calls


class Llama3Format(ToolFormat):
    name = "llama3"
    args_key = "parameters"

    def constraint(self, tools, parallel: bool) -> Constraint:
        obj = json.dumps(self.call_schema(tools))
        more = ' ("; " obj)*' if parallel else ""
        return Constraint("grammar", f"start: obj{more}\nobj: %json {obj}\n")

    def split(self, text: str):
        s = text.replace("<|python_tag|>", "")
        return ("", s) if s.lstrip().startswith("{") else (text, None)

    def calls_in(self, part: str):
        return _json_sequence(part.strip(), ";"), ""

    def may_start(self, text: str) -> int:
        s = text.replace("<|python_tag|>", "")
        return len(text) if not s.strip() or s.lstrip().startswith("{") else 0

    def complete_calls(self, part: str) -> int:
        return 0  # read when the output ends


class MistralFormat(ToolFormat):
    name = "mistral"

    def constraint(self, tools, parallel: bool) -> Constraint:
        obj = json.dumps(self.call_schema(tools))
        more = ' (", " obj)*' if parallel else ""
        return Constraint("grammar", f'start: "[" obj{more} "]"\nobj: %json {obj}\n')

    def split(self, text: str):
        i = text.find("[TOOL_CALLS]")
        if i >= 0:
            return text[:i], text[i + len("[TOOL_CALLS]"):]
        return ("", text) if text.lstrip().startswith("[{") else (text, None)

    def calls_in(self, part: str):
        try:
            arr = json.loads(part.strip())
        except ValueError:
            return [None], ""
        ok = isinstance(arr, list) and arr and all(isinstance(o, dict) for o in arr)
        return (arr if ok else [None]), ""

    def may_start(self, text: str) -> int:
        s = text.lstrip()
        if not s or "[{".startswith(s[:2]) or s.startswith("[{"):
            return len(text)
        return _held(text, "[TOOL_CALLS]")

    def complete_calls(self, part: str) -> int:
        return 0


FORMATS = {f.name: f for f in (ToolFormat(), Llama3Format(), MistralFormat())}


def format_for(chat_template: "str | None") -> "tuple[ToolFormat, bool]":
    """(the template's tool-call format, whether the template renders ``tools`` itself)."""
    t = chat_template or ""
    native = "tools" in t
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"], native
    if "<tool_call>" in t:
        return FORMATS["hermes"], native
    if "<|python_tag|>" in t or ("ipython" in t and '"parameters"' in t):
        return FORMATS["llama3"], native
    return FORMATS["hermes"], native


def fallback_messages(messages: list, tools) -> list:
    """Messages for a template without tools: the tools (if any) described in the system
    message, earlier calls and results written out as text in the hermes layout."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in m.pop("tool_calls")]
            blocks = [f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls]
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        if m["role"] == "tool":
            m = {"role": "user",
                 "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if not tools:
        return out
    prompt = FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t["function"]) for t in tools))
    if out and out[0]["role"] in ("system", "developer"):
        out[0] = dict(out[0], content=f"{out[0].get('content') or ''}\n\n{prompt}".lstrip())
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


def tool_call(name: str, arguments) -> dict:
    """An OpenAI tool call: an id, the function's name, its arguments as a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _json_object(text: str):
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _json_sequence(text: str, sep: str) -> list:
    """JSON objects one after another, separated by ``sep``; [None] if any part is not one."""
    dec, pos, out = json.JSONDecoder(), 0, []
    while pos < len(text):
        try:
            obj, pos = dec.raw_decode(text, pos)
        except ValueError:
            return [None]
        out.append(obj if isinstance(obj, dict) else None)
        rest = text[pos:].lstrip()
        if rest.startswith(sep):
            rest = rest[len(sep):].lstrip()
        pos = len(text) - len(rest)
    return out or [None]


def _held(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolStream:
    """Reads a streaming answer: content deltas until a call begins, then each call once it is
    complete (the rest when the output ends)."""

    def __init__(self, fmt: ToolFormat, tools):
        self.fmt, self.tools = fmt, tools
        self.text = ""
        self.sent = 0  # content characters handed out
        self.calls_sent = 0

    def add(self, delta: str, final: bool) -> "tuple[str, list]":
        """Take the next text delta; returns (content delta, new tool calls)."""
        self.text += delta
        content, part = self.fmt.split(self.text)
        if part is None:  # no call yet: hand out the content but what may start one
            end = len(self.text) if final else len(self.text) - self.fmt.may_start(self.text)
            return self._content(self.text[:end]), []
        if not final:
            ready = self.fmt.complete_calls(part)
            piece = self._content(content)
            if ready <= self.calls_sent:
                return piece, []
            _, calls = self.fmt.parse(self.text[:self._end_of(ready)], self.tools)
            new = calls[self.calls_sent:]
            self.calls_sent += len(new)
            return piece, new
        content, calls = self.fmt.parse(self.text, self.tools)
        if not calls:  # not a call after all: the rest is content
            return self._content(self.text), []
        new = calls[self.calls_sent:]
        self.calls_sent += len(new)
        return self._content(content or ""), new

    def _content(self, upto: str) -> str:
        """The part of ``upto`` (content so far) not handed out yet."""
        piece = upto[self.sent:] if len(upto) > self.sent else ""
        self.sent = max(self.sent, len(upto))
        return piece

    def _end_of(self, n: int) -> int:
        """Index just past the n-th closed call (hermes)."""
        pos = 0
        for _ in range(n):
            pos = self.text.index("</tool_call>", pos) + len("</tool_call>")
        return pos
