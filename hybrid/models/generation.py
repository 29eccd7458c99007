"""Generation: text generation for Model, as requests through hybrid.Engine.

``generate``, ``stream``, ``chat`` and ``generate_batch`` each build an engine over the model
and feed it requests, so a call here and a server request compute the same bits.  A Model is a
Generation; this class only needs the Model's ``check_ids``, ``check_room``, ``tokenizer``,
``max_tokens`` and ``block_size``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: "str | None" = None  # Model.chat's

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        return max(self.new_tokens - 1, 0) / self.decode_s if self.decode_s else 0.0

    def __str__(self) -> str:
        return (f"prefill {self.prompt_tokens} tokens at {self.prefill_tps:.1f} tok/s, "
                f"decode {self.new_tokens} tokens at {self.decode_tps:.1f} tok/s")


class Generation:
    """Model's generation methods (a mixin: ``class Model(Generation)``)."""

    last_stats: GenerationStats  # the last generate/stream/chat call's figures

    def stop_ids(self, stop_tokens=None) -> set:
        """The token ids that end a generation: ``stop_tokens``, or the tokenizer's
        end-of-sequence ids when it is None."""
        stops = set(int(t) for t in stop_tokens) if stop_tokens is not None else set()
        if stop_tokens is None and self.tokenizer is not None:
            stops |= set(self.tokenizer.eos_ids)
        return stops

    def _requests(self, ids, max_new_tokens: int, detokenize: bool, kw: dict):
        """Run one request through a one-request Engine; yield its RequestOutputs.  The engine's
        pool holds exactly this request, its whole prompt is one step, and the prefix cache is
        off (each call computes its prompt, as a fresh cache would)."""
        from ..engine import Engine, GenerationParams

        kw = dict(kw)
        spec = {k: kw.pop(k) for k in ("speculative", "num_speculative_tokens", "draft_model",
                                          "adapt_drafts", "draft_vocab")
                if k in kw}
        ids = [int(t) for t in self.check_ids(ids)]
        if not ids:
            raise ValueError("the prompt has no tokens")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        self.check_room(len(ids) + max_new_tokens, self.max_tokens)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        if max_new_tokens == 0:
            GenerationParams(1, **kw)  # the parameters are still checked
            return
        params = GenerationParams(max_new_tokens, detokenize=detokenize, **kw)
        drafts = spec.get("num_speculative_tokens", 4) if spec.get("speculative") else 0
        engine = Engine(self, max_batch=1, max_batched_tokens=len(ids),
                        num_blocks=-(-(len(ids) + max_new_tokens + drafts) // self.block_size),
                        prefix_cache=False, **spec)
        rid = engine.add_request(ids, params)
        t0 = time.perf_counter()
        t_first = None
        try:
            while engine.has_unfinished():
                for out in engine.step():
                    now = time.perf_counter()
                    if out.new_tokens:
                        if t_first is None:
                            t_first, stats.prefill_s = now, now - t0
                        stats.new_tokens = len(out.tokens)
                        stats.decode_s = now - t_first
                    if out.finish_reason == "error":
                        raise RuntimeError(f"generation failed: {out.error}")
                    yield out
        finally:
            if engine.has_request(rid):
                engine.abort(rid)

    def generate(self, ids, max_new_tokens: int = 32, **kw) -> list:
        """The new token ids (stop tokens and the token completing a stop string included).

        Keywords: the fields of ``hybrid.GenerationParams`` (temperature, top_k, top_p,
        repetition_penalty, seed, stop_tokens, stop_strings), and ``speculative="ngram"`` (or
        "draft" with ``draft_model`` and ``draft_vocab``) with ``num_speculative_tokens`` and
        ``adapt_drafts`` (hybrid.Engine's; the output is the same)."""
        new: list = []
        for out in self._requests(ids, max_new_tokens, False, kw):
            new.extend(out.new_tokens)
        return new

    def stream(self, ids, max_new_tokens: int = 32, **kw):
        """Yield the generated text piece by piece as tokens arrive (whole characters; stop
        tokens add no text; the text ends before a stop string)."""
        if self.tokenizer is None:
            raise ValueError("streaming text needs a tokenizer")
        for out in self._requests(ids, max_new_tokens, True, kw):
            if out.delta:
                yield out.delta

    def chat(self, messages, max_new_tokens: int = 256, *, tools=None, tool_choice=None,
             parallel_tool_calls: bool = True, response_format=None, **kw) -> dict:
        """Answer OpenAI-style ``messages`` with an OpenAI-shaped assistant message:
        {"role": "assistant", "content": ..., "tool_calls": [...] (when the model calls)}.
        ``tools``/``tool_choice``/``parallel_tool_calls``/``response_format`` as in OpenAI's
        API (hybrid/chat.py); other keywords: the fields of ``hybrid.GenerationParams``.  The
        finish reason ("stop", "length" or "tool_calls") is in ``last_stats.finish_reason``."""
        from ..chat import plan_chat

        plan = plan_chat(self.tokenizer, messages, tools=tools, tool_choice=tool_choice,
                         parallel_tool_calls=parallel_tool_calls, response_format=response_format)
        if plan.constraint is not None:
            kw = dict(kw, constraint=plan.constraint)
        limit = max(1, min(max_new_tokens, (self.max_tokens or 1 << 30) - len(plan.ids)))
        last = None
        for last in self._requests(plan.ids, limit, True, kw):
            pass
        message, self.last_stats.finish_reason = plan.message(last.text, last.finish_reason)
        return message

    def generate_batch(self, prompts, max_new_tokens: int = 32, *, max_batch: int = 64,
                       kv_memory=None, **kw) -> list:
        """Generate for several prompts through the serving engine (hybrid.Engine: a shared KV
        pool, continuous batching, prefix caching).  Keywords: the fields of
        ``hybrid.GenerationParams``; prompt i samples with ``seed + i``.  Returns the new ids of
        each prompt."""
        from ..engine import Engine

        prompts = [list(self.check_ids(p)) for p in prompts]
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        for p in prompts:
            self.check_room(len(p) + max_new_tokens, self.max_tokens)
        engine = Engine(self, max_batch=max_batch, kv_memory=kv_memory)
        return engine.generate(prompts, max_new_tokens, **kw)
