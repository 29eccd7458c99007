"""A chat request, shared by ``Model.chat`` and the server: messages and tools become prompt ids
and a constraint; the generated text becomes an OpenAI-shaped assistant message.

    plan = plan_chat(tokenizer, messages, tools=tools, tool_choice="auto",
                     response_format={"type": "json_object"})
    ids = model.generate(plan.ids, 256, constraint=plan.constraint)
    message, finish = plan.message(text, "stop")   # {"role": "assistant", "content", "tool_calls"}

``tool_choice``: "none" (the tools are left out of the prompt and no call is read), "auto" (the
model may call; calls are read from its text), "required" (at least one call, enforced by a
grammar; one when ``parallel_tool_calls`` is false) or {"type": "function", "function":
{"name": ...}} (exactly that call).  Tools reach the template as ``tools``, as transformers
passes them; a template that knows no tools gets them in a system message
(hybrid.toolcalls.FALLBACK_PROMPT).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .structured import Constraint
from .toolcalls import ToolFormat, ToolStream, check_tools, fallback_messages, format_for


def response_format_constraint(rf) -> "Constraint | None":
    """OpenAI's ``response_format``: {"type": "text"}, {"type": "json_object"} or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}."""
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise ValueError("response_format.json_schema must be an object with a 'schema' "
                             "object")
        return Constraint("json_schema", js.get("schema", {}))
    raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                     f"got {kind!r}")


@dataclass
class ChatPlan:
    """What to run for a chat request and how to read its answer."""

    ids: list
    constraint: "Constraint | None" = None
    tools: "list | None" = None  # read calls from the answer (None: plain text)
    fmt: "ToolFormat | None" = None

    def message(self, text: str, finish_reason: str) -> "tuple[dict, str]":
        """(the assistant message, the finish reason: "tool_calls" when the answer calls)."""
        if self.tools is None:
            return {"role": "assistant", "content": text}, finish_reason
        content, calls = self.fmt.parse(text, self.tools)
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"

    def stream(self) -> "ToolStream | None":
        """A reader of the answer's deltas (None when there are no tools to read)."""
        return None if self.tools is None else ToolStream(self.fmt, self.tools)


def _template_messages(messages) -> list:
    """OpenAI messages as chat templates take them: an assistant call's arguments as an object
    (transformers' convention), missing content as ""."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                f = dict(c.get("function") or {})
                try:
                    f["arguments"] = json.loads(f.get("arguments") or "{}")
                except (TypeError, ValueError):
                    raise ValueError(f"tool call {c.get('id')!r}: arguments are not a JSON "
                                     f"string") from None
                calls.append(dict(c, function=f))
            m["tool_calls"] = calls
        elif m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def plan_chat(tokenizer, messages, *, tools=None, tool_choice=None,
              parallel_tool_calls: bool = True, response_format=None) -> ChatPlan:
    """The prompt ids, constraint and answer reader of a chat request (ValueError names a bad
    argument)."""
    if tokenizer is None:
        raise ValueError("chat needs the model's tokenizer")
    constraint = response_format_constraint(response_format)
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    named = None
    if isinstance(tool_choice, dict):
        f = tool_choice.get("function") if tool_choice.get("type") == "function" else None
        named = f.get("name") if isinstance(f, dict) else None
        if not isinstance(named, str):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    elif tool_choice not in ("none", "auto", "required"):
        raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a named function, "
                         f"got {tool_choice!r}")
    msgs = _template_messages(messages)
    if tool_choice != "none" and not tools:
        raise ValueError(f"tool_choice {tool_choice!r} needs tools")
    if tools is not None:
        check_tools(tools)
    fmt, native = format_for(tokenizer.chat_template)
    if tool_choice == "none" or not tools:
        if not native:  # earlier calls and results still need writing out as text
            msgs = fallback_messages(msgs, [])
        return ChatPlan(tokenizer.encode_chat(msgs), constraint)
    forced = tool_choice == "required" or named is not None
    if forced and constraint is not None:
        raise ValueError("response_format cannot be combined with a required or named "
                         "tool_choice (the calls are the answer's format)")
    if named is not None:
        chosen = [t for t in tools if t["function"]["name"] == named]
        if not chosen:
            raise ValueError(f"tool_choice names {named!r}, which is not among the tools")
        constraint = fmt.constraint(chosen, parallel=False)
    elif forced:
        constraint = fmt.constraint(tools, parallel=bool(parallel_tool_calls))
    if native:
        ids = tokenizer.encode_chat(msgs, tools=tools)
    else:
        ids = tokenizer.encode_chat(fallback_messages(msgs, tools))
    return ChatPlan(ids, constraint, tools, fmt)
