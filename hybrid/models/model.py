"""Model: embedding, decoder layers, final norm and LM head; generation comes from
Generation (hybrid/models/generation.py).

    model = hybrid.load_model()                      # the embedded SmolLM2-135M-Instruct
    ids = model.tokenizer.encode("Why is the sky blue?")
    new = model.generate(ids, max_new_tokens=32)     # greedy; the new tokens only
    for text in model.stream(ids, max_new_tokens=32): print(text, end="")

Each step (``forward_step``: prompt chunks or decode rows of many sequences, described once by a
hybrid.step.StepBatch) runs through every layer and then commits once, so every layer of a step
reads the same start position.  Generation runs as requests through hybrid.Engine, which feeds
its steps here.
"""

from __future__ import annotations

import numpy as np

from .. import kernel_role, ops, registry
from ..kvcache import PagedKVCache
from ..layer import DecoderLayer, forward_layers
from ..placement import (CPU, Placement, copy_between, is_device_array, placement_of,
                         to_device)
from ..quant import QuantizedTensor, dequantize
from ..scratch import Scratch
from ..step import StepBatch
from .generation import Generation, GenerationStats
from .weights import ModelWeights


def layer_placements(num_layers: int, gpu_layers=0, placements=None) -> list:
    """Per-layer placements: an explicit list, or the last ``gpu_layers`` on cuda:0 (llama.cpp's
    -ngl), the rest on the CPU."""
    if placements is not None:
        if len(placements) != num_layers:
            raise ValueError(f"placements has {len(placements)} entries for {num_layers} layers")
        return [Placement.parse(p) for p in placements]
    if isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < 0:
        raise ValueError(f"gpu_layers must be an integer >= 0, got {gpu_layers!r}")
    n_gpu = min(gpu_layers, num_layers)
    return [Placement.parse("cpu")] * (num_layers - n_gpu) + [Placement.parse("cuda:0")] * n_gpu


class Model(Generation):
    """A loaded decoder-only model.  See ``hybrid.load_model``.

    One Model runs one call at a time: its layers share activation buffers.  To serve threads in
    parallel, give each its own Model over the same ``ModelWeights`` (the weights are shared, not
    copied): ``Model(model.weights, model.tokenizer)``.
    """

    def __init__(self, weights: ModelWeights, tokenizer=None, *, gpu_layers: int = 0,
                 placements=None, kv_dtype: str = "float16", kv_on_cpu: bool = False,
                 block_size: int = 16, max_tokens: "int | None" = None):
        self.weights = weights
        self.tokenizer = tokenizer
        self.config = weights.config
        self.kv_dtype = kv_dtype
        self.block_size = block_size
        self.max_position = weights.max_position or None
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 2):
            raise ValueError(f"max_tokens must be an integer >= 2, got {max_tokens!r}")
        if max_tokens and self.max_position and max_tokens > self.max_position:
            raise ValueError(f"max_tokens {max_tokens} is more than the model's context length "
                             f"{self.max_position}")
        self.max_tokens = max_tokens or self.max_position
        self.placements = layer_placements(weights.num_layers, gpu_layers, placements)
        self.cache_placements = [Placement.parse("cpu") if kv_on_cpu else p
                                 for p in self.placements]
        scratch = Scratch()  # layers run one after another and share their buffers
        self._scratch = scratch
        configs = weights.layer_configs or [self.config] * weights.num_layers
        self.layers = [DecoderLayer(c, lw, index=i, placement=p, scratch=scratch)
                       for i, (c, lw, p) in enumerate(zip(configs, weights.layers,
                                                          self.placements))]
        self.embed = weights.embed  # [vocab, hidden] float32 or a QuantizedTensor
        self.final_norm = weights.final_norm  # [hidden]
        self.lm_head = weights.lm_head  # [vocab, hidden]
        # the final norm and LM head run where the last layer runs (on a GPU: copies there)
        self._head_at = self.placements[-1] if self.placements else CPU
        self._head_weights = (self.final_norm, self.lm_head)
        if not self._head_at.is_cpu:  # quantized heads are decoded for the GPU
            self._head_weights = (to_device(self.final_norm, self._head_at),
                                  to_device(dequantize(self.lm_head), self._head_at))
        self.last_stats = GenerationStats()
        # runs of consecutive layers on one device, each executed by its backend's whole-stack
        # call where it has one (the CPU backend's step_layers), else layer by layer
        self._runs = []
        for layer in self.layers:
            if not self._runs or self._runs[-1][0] != layer.placement:
                run = registry.optional("step_layers", layer.placement) or _layer_by_layer
                self._runs.append((layer.placement, [], run, {}))
            self._runs[-1][1].append(layer)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    @property
    def kv_window(self) -> "int | None":
        """Positions back from the newest that any layer still reads: the widest sliding window
        when every layer has one (older KV blocks can go back to the pool), else None."""
        windows = [layer.config.sliding_window for layer in self.layers]
        return max(windows) if windows and min(windows) > 0 else None

    def new_cache(self) -> PagedKVCache:
        return PagedKVCache(num_layers=len(self.layers), num_kv_heads=self.config.num_kv_heads,
                            head_dim=self.config.head_dim, block_size=self.block_size,
                            dtype=self.kv_dtype, placement=self.cache_placements,
                            max_tokens=self.max_tokens)

    # ------------------------------------------------------------------ forward
    def check_ids(self, ids) -> np.ndarray:
        """``ids`` as a 1-D int64 array, checked to be token ids of this model."""
        if type(ids) is list and len(ids) == 1 and type(ids[0]) is int \
                and 0 <= ids[0] < self.vocab_size:  # a decode step's token: checked cheaply
            return np.array(ids, dtype=np.int64)
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise TypeError("token ids must be a 1-D sequence of integers")
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got "
                             f"{int(arr.min())}..{int(arr.max())}")
        return arr.astype(np.int64)

    def check_room(self, total: int, limit: "int | None") -> None:
        """Raise if ``total`` tokens of one sequence exceed the context or ``limit`` (a cache's
        capacity)."""
        if self.max_position and total > self.max_position:
            raise ValueError(f"{total} tokens exceed the model's context length "
                             f"{self.max_position}")
        if limit and total > limit:
            raise ValueError(f"{total} tokens exceed the KV cache capacity {limit}")

    def _head(self, h) -> np.ndarray:
        """Final norm and LM head: h [rows, hidden] -> logits [rows, vocab] float32.  Every row
        takes the mat-vec kernel (one row per prompt, a few per decode step)."""
        norm, head = self._head_weights
        if self._head_at.is_cpu:
            return self._capped(ops.linear(ops.rmsnorm(h, norm, self.config.rms_norm_eps), head,
                                           role=kernel_role.DECODE))
        s, at, rows = self._scratch, self._head_at, h.shape[0]  # on the last layer's GPU
        hn = ops.rmsnorm(h, norm, self.config.rms_norm_eps,
                         out=s.get("head_norm", h.shape, placement=at))
        logits = ops.linear(hn, head, out=s.get("logits", (rows, head.shape[0]), placement=at))
        return self._capped(logits.to_host())  # [rows, vocab] float32

    def _capped(self, logits: np.ndarray) -> np.ndarray:
        """Gemma 2's final softcapping (logits unchanged for other models)."""
        cap = self.weights.logit_softcap
        if cap:
            logits = (np.float32(cap) * np.tanh(logits / np.float32(cap))).astype(np.float32)
        return logits

    def forward(self, ids, cache: PagedKVCache, role: str = kernel_role.AUTO) -> np.ndarray:
        """Run ``ids`` (continuing ``cache``), commit them, return the last position's logits.
        ``role``: "prompt" or "decode" picks the projection kernels by what the rows are
        (hybrid/kernel_role.py; what makes results batch-invariant), "auto" by their count.
        The one-sequence case of ``forward_step``."""
        return self.forward_step([(cache, ids)], role)[0]

    def forward_step(self, items, role: str = kernel_role.AUTO, rows: str = "last"):
        """One step of many sequences: items [(cache, ids)], each cache continued by its ids
        (a prefill chunk or decode tokens).  Returns the logits of each sequence's last row
        [len(items), vocab] (rows="all": a list with each sequence's [len(ids), vocab]) and
        commits every cache.  The sequences of one pool (the engine's
        caches share one) run as one ragged step through every layer (hybrid/step.py); caches
        with pools of their own run as one step each.  On error every cache is left as it
        was."""
        caches, ids = self._step_items(items, role)
        if rows not in ("last", "all"):
            raise ValueError(f"rows must be 'last' or 'all', got {rows!r}")
        pools: dict = {}  # pool -> the indices of its sequences, in order
        for i, c in enumerate(caches):
            pools.setdefault(id(c.pool), []).append(i)
        if rows == "all":
            if len(pools) != 1:
                raise ValueError("rows='all' needs the caches of one pool")
            return self._run_step(caches, ids, role, every_row=True)
        if len(pools) == 1:
            return self._run_step(caches, ids, role)
        logits = np.empty((len(caches), self.vocab_size), dtype=np.float32)
        starts, done = [c.seq_len for c in caches], []
        try:
            for group in pools.values():
                logits[group] = self._run_step([caches[i] for i in group],
                                               [ids[i] for i in group], role)
                done.extend(group)
        except BaseException:
            for i in done:
                caches[i].truncate(starts[i])
            raise
        return logits

    def hidden_step(self, items, role: str = kernel_role.AUTO) -> np.ndarray:
        """One step as ``forward_step``'s (its caches in one pool), for a caller that applies a
        head of its own (a draft model scoring part of the vocabulary): the LM head's input of
        each sequence's last row, [len(items), hidden] float32 on the host (the final norm
        applied)."""
        caches, ids = self._step_items(items, role)
        if len({id(c.pool) for c in caches}) != 1:
            raise ValueError("hidden_step needs the caches of one pool")
        x, batch = self._run_layers(caches, ids, role)
        if is_device_array(x):
            x = np.concatenate([x[r:r + 1].to_host() for r in batch.last_rows.tolist()])
        else:
            x = x[batch.last_rows]
        return ops.rmsnorm(np.ascontiguousarray(x, dtype=np.float32), self.final_norm,
                           self.config.rms_norm_eps)

    @property
    def head_on_cpu(self) -> bool:
        """Whether the final norm and LM head run on the CPU (they run where the last layer
        does)."""
        return self._head_at.is_cpu

    def _step_items(self, items, role: str):
        """(caches, ids arrays) of a step's items [(cache, ids)], checked."""
        kernel_role.check(role)
        caches = [c for c, _ in items]
        ids = [self.check_ids(t) for _, t in items]
        if not caches:
            raise ValueError("a step needs at least one sequence")
        for c, t in zip(caches, ids):
            if not isinstance(c, PagedKVCache):
                raise TypeError(f"expected PagedKVCache, got {type(c).__name__}")
            if t.size == 0:
                raise ValueError("every sequence of a step needs at least one token")
            self.check_room(c.seq_len + t.size, c.max_tokens)
        return caches, ids

    def _run_step(self, caches, ids, role: str, every_row: bool = False):
        """One ragged step over caches of one pool: plan, every layer, commit (or roll back),
        the head on each sequence's last row (every_row: on every row, split by sequence).  The
        projections take the kernels of the step's role (hybrid/kernel_role.py)."""
        x, batch = self._run_layers(caches, ids, role)
        if every_row:  # the head's mat-vec gives each row the bits it has alone
            total = sum(t.size for t in ids)
            logits = (np.concatenate([self._head(x[r:r + 1]) for r in range(total)])
                      if is_device_array(x) else self._head(x))
            return np.split(logits, np.cumsum([t.size for t in ids])[:-1])
        if is_device_array(x):  # the head on a GPU: device arrays slice by ranges only
            return np.concatenate([self._head(x[r:r + 1]) for r in batch.last_rows.tolist()])
        return self._head(x[batch.last_rows])  # [S, vocab]

    def _run_layers(self, caches, ids, role: str):
        """(x [T, hidden] after the last layer, the step) for one ragged step; every cache
        committed, or all rolled back on error."""
        batch = StepBatch.plan([(c, t.size) for c, t in zip(caches, ids)], role)
        x = self._embed(np.concatenate(ids))  # [T, hidden]
        try:
            x = self._through_layers(x, batch)
        except BaseException:
            batch.rollback()
            raise
        batch.commit()
        return x, batch

    def embedding(self, ids, pooling: str = "last") -> np.ndarray:
        """A [hidden] float32 embedding of ``ids``: the final norm's output at the last token
        ("last") or averaged over every token ("mean"), scaled to unit length (a fresh cache)."""
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")
        ids = self.check_ids(ids)
        if ids.size == 0:
            raise ValueError("the input has no tokens")
        self.check_room(ids.size, self.max_tokens)
        x, _ = self._run_layers([self.new_cache()], [ids], kernel_role.PROMPT)
        if is_device_array(x):
            x = x.to_host()
        h = ops.rmsnorm(np.ascontiguousarray(x, dtype=np.float32), self.final_norm,
                        self.config.rms_norm_eps)
        v = (h[-1] if pooling == "last" else h.mean(axis=0, dtype=np.float64)).astype(np.float64)
        n = np.linalg.norm(v)
        return (v / n if n > 0 else v).astype(np.float32)

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        """[n, hidden] float32 rows of the embedding (decoded on lookup when quantized)."""
        x = self.embed.rows(ids) if isinstance(self.embed, QuantizedTensor) else self.embed[ids]
        if self.weights.embed_scale != 1.0:
            x = x * np.float32(self.weights.embed_scale)
        return x

    def _through_layers(self, x: np.ndarray, batch: StepBatch) -> np.ndarray:
        """Run x [T, hidden] through every layer, one run of same-device layers at a time by
        that device's backend.  Activations move only where the placement changes (into reused
        buffers)."""
        for placement, layers, run, memo in self._runs:
            if placement_of(x) != placement:
                x = self._moved(x, placement)
            x = run(layers, batch, x, memo)
        return self._moved(x, self._head_at) if placement_of(x) != self._head_at else x

    def _moved(self, x, placement: Placement):
        buf = self._scratch.get("model_x", x.shape, placement=placement)
        copy_between(x, buf)
        return buf

    def logits(self, ids) -> np.ndarray:
        """[vocab] float32 logits of the last position of ``ids`` (a fresh cache)."""
        return self.forward(ids, self.new_cache())

def _layer_by_layer(layers, batch, x, memo):
    """A run of layers on a backend without a whole-stack call (``step_layers``)."""
    return forward_layers(layers, batch, x)

