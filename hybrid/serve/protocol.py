"""The OpenAI API's request bodies (the fields we serve), and its error body.

Validation happens here, before anything reaches the engine: a bad field becomes a 4xx response
with ``{"error": {"message", "type", "param", "code"}}`` naming the problem.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator


class APIError(Exception):
    """An error to send as an OpenAI-style JSON body with this HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: "str | None" = None, code: "str | None" = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(default=1, ge=1, le=1)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, str):
            v = [v]
        if v is not None and (len(v) > 4 or any(not s for s in v)):
            raise ValueError("stop takes up to 4 non-empty strings")
        return v

    def stop_list(self) -> list:
        return list(self.stop or [])


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int]]
    max_tokens: Optional[int] = Field(default=16, ge=1)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("prompt is an empty list of token ids")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[dict], None] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)

    @field_validator("messages")
    @classmethod
    def _messages(cls, v):
        if not v:
            raise ValueError("messages is empty; at least one message is needed")
        return v
