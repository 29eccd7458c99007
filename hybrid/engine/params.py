"""GenerationParams: how one request generates, the one parameters type of the Python API, the
engine and the server (sampling, limits, stop conditions)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationParams:
    """How one request generates.

    temperature 0 is greedy (argmax).  top_k 0 and top_p 1 turn those filters off.
    repetition_penalty > 1 discourages tokens already in the sequence (as transformers applies
    it: positive logits divided, negative multiplied).  ``seed`` makes sampling reproducible.
    stop_tokens None means the tokenizer's end-of-sequence ids; stop_strings end the request when
    the generated text contains one of them (the completing token is kept in the ids, the text
    is cut before the stop string).  detokenize False skips the text (token ids only) where no
    stop string needs it.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: "int | None" = None
    stop_tokens: "list | None" = None
    stop_strings: tuple = ()
    detokenize: bool = True

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"{name} must be a number, got {v!r}")
            setattr(self, name, float(v))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.stop_strings, str):
            self.stop_strings = (self.stop_strings,)
        self.stop_strings = tuple(self.stop_strings)
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if self.stop_tokens is not None:
            self.stop_tokens = [int(t) for t in self.stop_tokens]
