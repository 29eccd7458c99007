"""Constrained decoding: a request's output held to a JSON schema, a regex, a list of choices or
a grammar (Lark, or llama.cpp's GBNF), by a token mask applied to its logits before sampling.

    c = Constraint("json_schema", {"type": "object", ...})     # plain data in GenerationParams
    c.check()                                                    # ValueError naming the problem
    m = c.matcher(tokenizer, vocab_size)                         # one per request
    m.fill_mask(); allowed = m.allowed()                         # bool [vocab]
    m.accept(token)                                              # advance; m.done: nothing more

The masks come from llguidance (the ``structured`` extra), which is imported only when a
request carries a constraint.  Its tokenizer is built once per hybrid Tokenizer.  JSON is laid
out as ``json.dumps`` writes it (", " and ": ", no other whitespace), so a model cannot wander
off into endless whitespace.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field

import numpy as np

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
_JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 - the mask helpers
    except ImportError as exc:
        raise ImportError("constrained decoding needs llguidance "
                          "(pip install 'hybrid[structured]')") from exc
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match.  ``kind``: "json_schema" (value: the schema, a dict),
    "json_object" (any JSON object; value unused), "regex" (a pattern), "choice" (a list of
    strings), "grammar" (Lark text, or GBNF: told apart by its ``::=`` rules).  ``check()``
    compiles it once."""

    kind: str
    value: object = None
    _compiled: list = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {', '.join(KINDS)}; got "
                             f"{self.kind!r}")
        v = self.value
        if self.kind == "json_schema" and not isinstance(v, (dict, bool)):
            raise ValueError("a json_schema constraint takes the schema as a JSON object")
        if self.kind in ("regex", "grammar") and (not isinstance(v, str) or not v):
            raise ValueError(f"a {self.kind} constraint takes a non-empty string")
        if self.kind == "choice" and (not isinstance(v, (list, tuple)) or not v or not all(
                isinstance(s, str) and s for s in v)):
            raise ValueError("a choice constraint takes a non-empty list of non-empty strings")

    def grammar(self) -> str:
        """The llguidance grammar (compiled on the first call).  ValueError names what cannot
        be compiled."""
        if not self._compiled:
            self._compiled.append(_compile(self.kind, self.value))
        return self._compiled[0]

    def check(self) -> None:
        """Raise ValueError if the constraint cannot be compiled."""
        self.grammar()

    def matcher(self, tokenizer, vocab_size: int) -> "TokenMatcher":
        """A fresh matcher for one request over ``tokenizer`` (hybrid's) and ``vocab_size``
        logits."""
        if tokenizer is None:
            raise ValueError("constrained decoding needs the model's tokenizer")
        return TokenMatcher(self.grammar(), _ll_tokenizer(tokenizer, vocab_size), vocab_size)


def _compile(kind: str, value) -> str:
    llg = _llguidance()
    M = llg.LLMatcher
    try:
        if kind == "json_schema":
            grammar = M.grammar_from_json_schema(json.dumps(value), defaults=_JSON_LAYOUT)
        elif kind == "json_object":
            grammar = M.grammar_from_json_schema('{"type": "object"}', defaults=_JSON_LAYOUT)
        elif kind == "regex":
            grammar = M.grammar_from_regex(value)
        elif kind == "choice":
            grammar = M.grammar_from_lark("start: " + " | ".join(json.dumps(s) for s in value))
        else:  # Lark as is; GBNF (llama.cpp's grammars) translated to Lark
            from llguidance.gbnf_to_lark import any_to_lark
            grammar = M.grammar_from_lark(any_to_lark(value))
    except Exception as exc:  # noqa: BLE001 - the compilers raise assorted types for bad text
        raise ValueError(f"the {kind} cannot be compiled: {exc}") from None
    is_error, messages = M.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"the {kind} cannot be compiled: {messages[0] if messages else '?'}")
    return grammar


_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of a hybrid Tokenizer (its tokenizers JSON), built once (~0.2 s)."""
    cached = _TOKENIZERS.get(tokenizer)
    if cached is not None and cached[0] == vocab_size:
        return cached[1]
    llg = _llguidance()
    try:
        ll = llg.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                             eos_token=list(tokenizer.eos_ids) or None)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ValueError(f"constrained decoding cannot read this tokenizer: {exc}") from None
    _TOKENIZERS[tokenizer] = (vocab_size, ll)
    return ll


class TokenMatcher:
    """One request's position in its grammar: the mask of allowed next tokens, and the tokens
    taken so far."""

    def __init__(self, grammar: str, ll_tokenizer, vocab_size: int):
        llg = _llguidance()
        self._np = llg.numpy
        self.matcher = llg.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the constraint cannot be used: {self.matcher.get_error()}")
        self.vocab_size = vocab_size
        self.bitmask = self._np.allocate_token_bitmask(1, vocab_size)
        self.fresh = False  # the bitmask is the mask of the current position

    def fill_mask(self) -> None:
        """Compute the mask of the next token (llguidance drops the GIL meanwhile, so this can
        run beside the model's step)."""
        if not self.fresh:
            self._np.fill_next_token_bitmask(self.matcher, self.bitmask)
            self.fresh = True

    def allowed(self) -> np.ndarray:
        """bool [vocab]: the tokens the constraint allows next."""
        self.fill_mask()
        bits = np.unpackbits(self.bitmask[0].view(np.uint8), bitorder="little")
        return bits[:self.vocab_size].astype(bool)

    def accept(self, token: int) -> None:
        """Advance past ``token``; ValueError if the constraint does not allow it."""
        self.fresh = False
        if not self.matcher.consume_token(int(token)):
            raise ValueError(f"token {token} breaks the constraint: {self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The output is complete: the constraint allows no further token."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far matches the whole constraint (it may still go on)."""
        return self.matcher.is_accepting()
