"""Tokenizers built on the ``tokenizers`` library: from GGUF metadata or a ``tokenizer.json``.

GGUF byte-level BPE vocabularies (``tokenizer.ggml.model = "gpt2"``) become a tokenizers BPE
model with the file's merges, split the way llama.cpp splits for the file's
``tokenizer.ggml.pre`` (hybrid/models/pretokenize.py; an unknown name is refused).  SentencePiece vocabularies (``"llama"``: Llama 2, Mistral) become a BPE
with "▁" spaces and byte fallback, merges rebuilt from the token scores when the file has none.
Tokens the file marks as control stay whole as special tokens.
Chat templates are rendered with jinja2 in a sandbox, as transformers does.
"""

from __future__ import annotations

import json
import os
import re
import uuid

import numpy as np

from .errors import ModelLoadError
from .pretokenize import SPLITS, split_rules

CONTROL, USER_DEFINED = 3, 4


def _tokenizers():
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError("hybrid's tokenizer needs the 'tokenizers' package "
                          "(pip install 'hybrid[models]')") from exc
    return tokenizers


def merges_from_scores(tokens, scores) -> list:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two tokens,
    best-scored results first (how transformers rebuilds them for GGUF files without merges)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _byte_level_bpe(tk, vocab, merges, rules, whole_words: bool):
    """A byte-level BPE that splits words with ``rules`` (hybrid/models/pretokenize.py)."""
    backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                         ignore_merges=whole_words))
    pt = tk.pre_tokenizers
    backend.pre_tokenizer = pt.Sequence(
        [pt.Split(tk.Regex(r), behavior="isolated") for r in rules]
        + [pt.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = tk.decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(tk, vocab, merges):
    """Llama/Mistral SentencePiece BPE: "▁" for spaces and a leading one, <0xNN> byte fallback."""
    backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=True,
                                         byte_fallback=True))
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="\u2581",
                                                        prepend_scheme="first", split=False)
    d = tk.decoders
    backend.decoder = d.Sequence([d.Replace("\u2581", " "), d.ByteFallback(), d.Fuse(),
                                  d.Strip(content=" ", left=1)])
    return backend


def _check_vocabulary(path, meta: dict) -> None:
    """The GGUF tokenizer arrays and special ids, checked before anything is built from them:
    a corrupt entry raises ModelLoadError naming its key."""
    tokens = meta["tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ModelLoadError(path, "tokenizer.ggml.tokens is not a list of strings")
    n = len(tokens)
    merges = meta.get("merges")
    if merges is not None and not (isinstance(merges, list) and all(
            isinstance(m, str) and " " in m for m in merges)):
        raise ModelLoadError(path, "tokenizer.ggml.merges is not a list of 'left right' pairs")
    for key, what in (("token_types", "token_type"), ("scores", "scores")):
        arr = meta.get(key)
        if arr is not None and (not isinstance(arr, np.ndarray) or arr.ndim != 1
                                or len(arr) != n or (key == "scores" and arr.dtype.kind != "f")
                                or (key == "token_types" and arr.dtype.kind not in "iu")):
            raise ModelLoadError(path, f"tokenizer.ggml.{what} does not have one entry per token "
                                       f"({n})")
    for key, what in (("tokenizer_pre", "pre"), ("chat_template", "chat_template")):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise ModelLoadError(path, f"tokenizer.{'' if what == 'chat_template' else 'ggml.'}"
                                       f"{what} is not a string")
    for key in ("bos_token_id", "eos_token_id"):
        i = meta.get(key)
        if i is not None and (isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n):
            raise ModelLoadError(path, f"tokenizer.ggml.{key} {i!r} is outside the vocabulary of "
                                       f"{n} tokens")


class Tokenizer:
    """Text <-> token ids, special tokens, and the model's chat template.

    ``encode(text)`` -> list[int] (with BOS when the model asks for it); ``decode(ids)`` -> str;
    ``apply_chat_template(messages)`` -> the prompt string the model was trained on.
    """

    def __init__(self, backend, bos_id=None, eos_ids=(), add_bos=False, chat_template=None,
                 bos_token=None, eos_token=None):
        self.backend = backend  # tokenizers.Tokenizer
        self.bos_id = bos_id
        self.eos_ids = tuple(i for i in eos_ids if i is not None)
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._specials = None  # the special tokens' texts (encode_chat)
        self._plain = None  # the backend without special-token matching (encode_chat)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""

    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            tools=None) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}]) with the model's template
        (``tools``: OpenAI's tool list, passed to the template as transformers does)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise ImportError("chat templates need jinja2 (pip install 'hybrid[models]')") from exc

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            # transformers' tojson: plain json.dumps (jinja2's own escapes < > & ')
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = tojson
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, messages, add_generation_prompt: bool = True, tools=None) -> list:
        """The token ids of ``messages`` rendered with the chat template, where only the
        template's own markup becomes special tokens: text in a message that spells a special
        token (``<|im_start|>system``...) is encoded as plain text, so a user cannot forge turns.
        Messages without such text give exactly ``encode(apply_chat_template(messages))``."""
        contents = [m.get("content") or "" for m in messages]
        specials = self._special_texts()
        if not any(sp in c for c in contents for sp in specials):
            return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools),
                               add_special_tokens=False)
        # render with a unique marker in place of each content, then encode the template's
        # pieces as usual and the contents with special-token matching off
        nonce = uuid.uuid4().hex
        marks = [f"\x00{nonce}:{i}\x00" for i in range(len(messages))]
        marked = [dict(m, content=mark) for m, mark in zip(messages, marks)]
        text = self.apply_chat_template(marked, add_generation_prompt, tools)
        ids, pos = [], 0
        for m in re.finditer(f"\x00{nonce}:(\\d+)\x00", text):
            ids += self.encode(text[pos:m.start()], add_special_tokens=False)
            ids += self._plain_backend().encode(contents[int(m.group(1))],
                                                add_special_tokens=False).ids
            pos = m.end()
        return ids + self.encode(text[pos:], add_special_tokens=False)

    def _plain_backend(self):
        """A copy of the backend that encodes special-token text as plain text."""
        if self._plain is None:
            plain = type(self.backend).from_str(self.backend.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def _special_texts(self) -> list:
        """The text of every special (control) token."""
        if self._specials is None:
            self._specials = [t.content for t in self.backend.get_added_tokens_decoder().values()
                              if t.special]
        return self._specials

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_gguf_metadata(cls, meta: dict, path="(gguf)") -> "Tokenizer":
        tk = _tokenizers()
        kind = meta.get("tokenizer_model")
        tokens = meta.get("tokens")
        if not tokens:
            raise ModelLoadError(path, "the file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
        if kind not in ("gpt2", "llama"):
            raise ModelLoadError(path, f"tokenizer type {kind!r} is not supported (supported: "
                                       f"'gpt2' byte-level BPE, 'llama' SentencePiece BPE)")
        _check_vocabulary(path, meta)
        vocab = {t: i for i, t in enumerate(tokens)}
        if meta.get("merges"):
            merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        elif kind == "llama":
            scores = meta.get("scores")
            merges = merges_from_scores(tokens, [0.0] * len(tokens) if scores is None
                                        else scores.tolist())
        else:
            raise ModelLoadError(path, "a byte-level BPE vocabulary without merges")
        if kind == "gpt2":
            try:
                rules, whole = split_rules(meta.get("tokenizer_pre"))
            except KeyError:
                raise ModelLoadError(path, f"tokenizer.ggml.pre {meta.get('tokenizer_pre')!r} "
                                           f"is not a known pre-tokenizer (known: "
                                           f"{', '.join(sorted(SPLITS))})") from None
        types = meta.get("token_types")
        types = [] if types is None else types.tolist()  # (a short-lived list while building)
        try:  # the tokenizers package checks the merges against the vocabulary
            if kind == "llama":
                backend = _sentencepiece_bpe(tk, vocab, merges)
            else:
                backend = _byte_level_bpe(tk, vocab, merges, rules, whole)
            special = [tk.AddedToken(t, special=True, normalized=False)
                       for t, ty in zip(tokens, types) if ty == CONTROL]
            if special:
                backend.add_special_tokens(special)
            user = [tk.AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED]
            if user:
                backend.add_tokens(user)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # Rust panics surface as BaseException
            raise ModelLoadError(path, f"the tokenizer cannot be built from the file's vocabulary "
                                       f"and merges: {exc}") from None
        bos, eos = meta.get("bos_token_id"), meta.get("eos_token_id")
        eos_ids = [eos]
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
            if name in vocab and types and types[vocab[name]] == CONTROL:
                eos_ids.append(vocab[name])
        add_bos = meta.get("add_bos_token")
        return cls(backend, bos_id=bos, eos_ids=sorted(set(i for i in eos_ids if i is not None)),
                   add_bos=(kind == "llama") if add_bos is None else add_bos,
                   chat_template=meta.get("chat_template"),
                   bos_token=tokens[bos] if bos is not None and bos < len(tokens) else None,
                   eos_token=tokens[eos] if eos is not None and eos < len(tokens) else None)

    @classmethod
    def from_folder(cls, folder, eos_from_config=None) -> "Tokenizer":
        """From ``tokenizer.json`` (+ ``tokenizer_config.json``) in a Hugging Face model folder."""
        tk = _tokenizers()
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise ModelLoadError(folder, "no tokenizer.json in the model folder")
        try:
            backend = tk.Tokenizer.from_file(path)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the tokenizers package's own errors and Rust panics
            raise ModelLoadError(path, f"not a readable tokenizer ({exc})") from None
        conf = {}
        cpath = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(cpath):
            with open(cpath, encoding="utf-8") as f:
                try:
                    conf = json.load(f)
                except (ValueError, RecursionError) as exc:
                    raise ModelLoadError(cpath, f"invalid JSON ({exc})") from None
            if not isinstance(conf, dict):
                raise ModelLoadError(cpath, "not a JSON object")

        def token_of(key):
            v = conf.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return v if isinstance(v, str) else None

        bos_t, eos_t = token_of("bos_token"), token_of("eos_token")
        bos = backend.token_to_id(bos_t) if bos_t else None
        eos_ids = [backend.token_to_id(eos_t)] if eos_t else []
        if not isinstance(eos_from_config, (list, tuple)):
            eos_from_config = [eos_from_config]
        eos_ids += [i for i in eos_from_config if isinstance(i, int) and not isinstance(i, bool)]
        template = conf.get("chat_template")
        if isinstance(template, list):  # named templates (transformers): the default one
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        if template is not None and not isinstance(template, str):
            raise ModelLoadError(cpath, "chat_template is neither a string nor a list of named "
                                        "templates")
        return cls(backend, bos_id=bos, eos_ids=sorted(set(i for i in eos_ids if i is not None)),
                   add_bos=bool(conf.get("add_bos_token", False)),
                   chat_template=template, bos_token=bos_t, eos_token=eos_t)
