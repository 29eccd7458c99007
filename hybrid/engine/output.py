"""The output side of a request: generated ids become text, stop strings end it.

One ``TextOutput`` per request, fed every sampled token by the engine.  It is the one place that
detokenizes and checks stop strings; ``Model.stream``, the CLI and the server read its text from
the engine's ``RequestOutput`` (``text``, and ``delta``: what is new and safe to show).

Both parts cost time linear in the generated length: the detokenizer decodes only a window of
the last few tokens per step, and the stop check searches only text that can hold a stop string
that was not there before.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Text of a growing list of token ids, one piece per new token.

    Each step decodes two windows that start at the same token (``prefix``): the tokens already
    shown and the same plus the new ones.  The new text is the difference, so a tokenizer that
    treats the first token of a window specially (SentencePiece's leading space) does so in both.
    A piece that ends inside a multi-byte character waits for the tokens that complete it.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list = []
        self.prefix = 0  # first token of the window
        self.read = 0  # tokens whose text has been given out

    def add(self, token: int) -> str:
        """Take one token; returns the text it completes ("" while a character is incomplete)."""
        self.ids.append(token)
        decode = self.tokenizer.decode
        shown = decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        text = decode(self.ids[self.prefix:])
        if len(text) > len(shown) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(shown):]
        return ""

    def flush(self) -> str:
        """The text of the tokens still held back (an incomplete character at the end)."""
        if self.read == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        shown = decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        text = decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(shown):]


class StopStrings:
    """Finds the first stop string in text that only grows, searching each part once."""

    def __init__(self, stops):
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.searched = 0  # no stop string starts before this index

    def find(self, text: str) -> int:
        """Index of the earliest stop string in ``text``, or -1."""
        if not self.stops:
            return -1
        start = max(0, self.searched - self.longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self.searched = len(text)
        return min(hits) if hits else -1

    def held(self, text: str) -> int:
        """Length of the longest end of ``text`` that could begin a stop string (not to be shown
        yet: the next token may complete the stop string)."""
        for n in range(min(self.longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0


class TextOutput:
    """A request's generated text: ids in, text and stop-string state out.

    ``skip`` ids (the request's stop tokens, such as end-of-sequence) add no text.
    """

    def __init__(self, tokenizer, stop_strings=(), skip=()):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopStrings(stop_strings)
        self.skip = frozenset(skip)
        self.text = ""  # the text so far (cut before the stop string once one appeared)
        self.stopped = False  # a stop string appeared
        self.sent = 0  # characters handed out as deltas

    def add(self, token: int) -> None:
        if self.stopped or token in self.skip:
            return
        piece = self.detok.add(token)
        if piece:
            self._grow(piece)

    def finish(self) -> None:
        """The request ended: the text held back for an incomplete character comes out."""
        if not self.stopped:
            piece = self.detok.flush()
            if piece:
                self._grow(piece)

    def _grow(self, piece: str) -> None:
        self.text += piece
        cut = self.stops.find(self.text)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True

    def delta(self, final: bool) -> str:
        """Text not handed out yet; while running, less the end that could begin a stop string."""
        end = len(self.text) if final or self.stopped else \
            len(self.text) - self.stops.held(self.text)
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:end], end
        return piece
