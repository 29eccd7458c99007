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
    n: json_int(ge=1, le=1) = 1
    user: Optional[str] = None  # the caller's end-user id: accepted, not used

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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[TextPart], None] = None

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


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[json_int(ge=1)] = None
    logprobs: bool = False
    top_logprobs: Optional[json_int(ge=0, le=20)] = None

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
