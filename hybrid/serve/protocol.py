"""The OpenAI API's request bodies (the fields we serve), and its error body.

Validation happens here, before anything reaches the engine: a bad field becomes a 4xx response
with ``{"error": {"message", "type", "param", "code"}}`` naming the problem.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator


class APIError(Exception):
    """An error to send as an OpenAI-style JSON body with this HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: "str | None" = None, code: "str | None" = None,
                 headers: "dict | None" = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers  # e.g. Retry-After on a 429

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _integral_float(v):
    """JSON Schema counts 16.0 as an integer: take it as 16 (a string or a bool stays refused)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def json_int(**bounds):
    """An integer field (ge=..., le=...) that takes 16.0 as 16; the bounds sit on the integer so
    the OpenAPI schema shows them as minimum/maximum."""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral_float)]


JsonInt = json_int()


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    """What every 4xx/5xx answer holds (documented in the OpenAPI schema)."""
    error: ErrorDetail


RESPONSES = {
    200: {"description": "The completion: a JSON body, or with `stream: true` Server-Sent Events "
                         "(`data: {chunk}` lines ending in `data: [DONE]`)",
          "content": {"text/event-stream": {"schema": {"description": "Server-Sent Events"}}}},
}
ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "The request is invalid: the message names the "
                                                 "field (`param`) and the problem"},
    404: {"model": ErrorResponse, "description": "The model is not the one served"},
    408: {"model": ErrorResponse, "description": "The request ran past the server's deadline "
                                                 "(`--request-timeout`)"},
    413: {"model": ErrorResponse, "description": "The body is larger than the server accepts "
                                                 "(`--max-body-bytes`)"},
    415: {"model": ErrorResponse, "description": "The body is not sent as application/json"},
    429: {"model": ErrorResponse, "description": "The queue is full or too many requests run at "
                                                 "once; retry after `Retry-After` seconds"},
    500: {"model": ErrorResponse, "description": "The server failed the request (logged under "
                                                 "the request id the message gives)"},
    503: {"model": ErrorResponse, "description": "The server is shutting down, or its engine "
                                                 "stopped"},
}
RESPONSES.update(ERROR_RESPONSES)
ERROR_ONLY = {k: ERROR_RESPONSES[k] for k in (400, 404, 413, 415, 503)}
UNAUTHORIZED = {401: {"model": ErrorResponse, "description": "Missing or wrong API key"}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


def _utf8(v):
    """Text must be encodable as UTF-8: JSON's \\ud800 escapes give lone surrogates."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text holds a lone surrogate (U+{ord(exc.object[exc.start]):04X})"
                             f" at character {exc.start}; send valid Unicode") from None
    elif isinstance(v, list):
        for item in v:
            _utf8(item)
    elif isinstance(v, dict):
        for item in v.values():
            _utf8(item)
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Optional[str] = None
    schema_: Optional[dict] = Field(default=None, alias="schema")
    strict: Optional[bool] = None  # outputs always follow the schema: strict or not


class ResponseFormat(_Strict):
    """OpenAI's response_format: free text, any JSON object, or JSON following a schema."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs json_schema")
        return self

    def as_dict(self) -> dict:
        d = {"type": self.type}
        if self.json_schema is not None:
            d["json_schema"] = {"name": self.json_schema.name,
                                "schema": self.json_schema.schema_ or {}}
        return d


class StructuredOutputs(_Strict):
    """vLLM's extension: exactly one of a JSON schema, a regex, a list of choices, or a grammar
    (Lark, or llama.cpp's GBNF)."""
    json_: Optional[Union[dict, str]] = Field(default=None, alias="json")
    regex: Optional[Annotated[str, Field(min_length=1)]] = None
    choice: Optional[Annotated[list[Annotated[str, Field(min_length=1)]],
                               Field(min_length=1)]] = None
    grammar: Optional[Annotated[str, Field(min_length=1)]] = None

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("structured_outputs takes exactly one of json, regex, choice, grammar")
        return self


class _Sampling(BaseModel):
    # strict: JSON types as the API documents them (no "16" for 16, no false for token id 0);
    # a float field still takes an integer; Infinity and NaN are refused
    # a field we do not implement is refused by name (extra="forbid"), never silently dropped
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: Optional[str] = None
    max_tokens: Optional[json_int(ge=1)] = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: json_int(ge=0) = 0
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")],
                              Annotated[float, Field(ge=-100.0, le=100.0)]]] = None
    seed: Optional[JsonInt] = None
    stop: Optional[Union[Annotated[str, Field(min_length=1)],
                         Annotated[list[Annotated[str, Field(min_length=1)]],
                                   Field(max_length=4)]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: json_int(ge=1, le=16) = 1
    user: Optional[str] = None  # the caller's end-user id: accepted, not used
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None

    @model_validator(mode="after")
    def _one_format(self):
        if self.response_format is not None and self.structured_outputs is not None \
                and self.response_format.type != "text":
            raise ValueError("give response_format or structured_outputs, not both")
        return self

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, v):
        _utf8(v)
        if isinstance(v, list) and (len(v) > 4 or any(s == "" for s in v)) or v == "":
            raise ValueError("stop takes up to 4 non-empty strings")
        return v

    def bias(self) -> dict:
        """logit_bias with integer token ids (JSON object keys are strings)."""
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    def stop_list(self) -> list:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Sampling):
    prompt: Union[Annotated[str, Field(min_length=1)],
                  Annotated[list[json_int(ge=0, lt=2**31)], Field(min_length=1)]]
    max_tokens: Optional[json_int(ge=1)] = 16
    logprobs: Optional[json_int(ge=0, le=5)] = None
    echo: bool = False

    @model_validator(mode="after")
    def _echo_without_logprobs(self):
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs is not supported: the prompt's logprobs are "
                             "not computed")
        return self

    def logprobs_k(self) -> "int | None":
        return self.logprobs

    @field_validator("prompt", mode="before")  # before the schema's own min_length message
    @classmethod
    def _prompt(cls, v):
        if v == [] or v == "":
            raise ValueError("prompt is empty")
        return _utf8(v)


class TextPart(BaseModel):
    """A content part of a message: only text is served (an image part is refused by name)."""
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # a JSON object, as a string (OpenAI's)


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None  # a tool message answers this call

    @model_validator(mode="after")
    def _roles(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def as_dict(self) -> dict:
        """The message as chat templates and hybrid.chat take it."""
        d = {"role": self.role, "content": None if self.content is None and self.tool_calls
             else self.text()}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls is not None:
            d["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v):
        _utf8(v)
        if isinstance(v, list):
            for part in v:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(f"only text content parts are supported, got {kind!r}")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDef(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Optional[str] = None
    parameters: Optional[dict] = None
    strict: Optional[bool] = None  # arguments always follow the schema when a call is forced


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[json_int(ge=1)] = None
    logprobs: bool = False
    top_logprobs: Optional[json_int(ge=0, le=20)] = None
    tools: Optional[Annotated[list[Tool], Field(min_length=1, max_length=128)]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: bool = True

    def tool_list(self) -> "list | None":
        return None if self.tools is None else [t.model_dump(exclude_none=True)
                                                 for t in self.tools]

    def tool_choice_value(self):
        c = self.tool_choice
        return c.model_dump() if isinstance(c, NamedToolChoice) else c

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprobs_k(self) -> "int | None":
        """Alternatives per token to report (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages", mode="before")  # before the schema's own min_length message
    @classmethod
    def _messages(cls, v):
        if v == []:
            raise ValueError("messages is empty; at least one message is needed")
        return v


class TokenizeRequest(_Strict):
    """POST /tokenize: a prompt's ids, or a chat's (rendered with the template)."""
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give prompt or messages (one of them)")
        _utf8(self.prompt)
        return self


class DetokenizeRequest(_Strict):
    """POST /detokenize: the text of token ids."""
    model: Optional[str] = None
    tokens: list[json_int(ge=0, lt=2**31)]


class EmbeddingRequest(_Strict):
    """POST /v1/embeddings: one vector per input, the final hidden state pooled (the last
    token's, or the mean over the tokens) and scaled to unit length."""
    model: Optional[str] = None
    input: Union[Annotated[str, Field(min_length=1)],
                 Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1,
                                                                            max_length=256)],
                 Annotated[list[json_int(ge=0, lt=2**31)], Field(min_length=1)],
                 Annotated[list[Annotated[list[json_int(ge=0, lt=2**31)], Field(min_length=1)]],
                           Field(min_length=1, max_length=256)]]
    encoding_format: Literal["float", "base64"] = "float"
    pooling: Literal["last", "mean"] = "last"
    user: Optional[str] = None

    @field_validator("input", mode="before")
    @classmethod
    def _text(cls, v):
        if v == "" or v == []:
            raise ValueError("input is empty")
        return _utf8(v)

    def inputs(self) -> list:
        """Each input: a string or a list of ids."""
        x = self.input
        if isinstance(x, str) or (x and isinstance(x[0], int)):
            return [x]
        return list(x)
