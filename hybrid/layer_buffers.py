"""LayerBuffers: a decoder layer's activation buffers and the native calls bound to them.

The buffers are views into a Scratch that layers running one after another share.  On the CPU,
a layer with quantized projections binds its Q/K/V and its gate/up projections each into one
call that quantizes the activations once, and, for a dense SwiGLU layer, the whole decode step
of a row into two native calls around the attention.  Buffers and bound calls are kept for the
next call with the same number of rows, so a decode step allocates and binds nothing;
``version`` changes whenever they are made anew (a stack's remembered decode steps are then
stale).
"""

from __future__ import annotations

from .placement import Placement


class LayerBuffers:
    """One layer's buffers and bound calls.

    Parameters
    ----------
    config : the layer's DecoderConfig
    weights : its LayerWeights on its device
    placement : its Placement
    scratch : the shared Scratch
    inv_freq : its RoPE frequencies (None without RoPE)
    many : the backend's bind_linear_many (quantized CPU projections), or None
    bind_decode : the backend's bind_decode_step (None: no native decode step)
    expert_counts : a mixture of experts' routing counts (int64 [E], which the native decode
        step raises as the layer's op-by-op path does), or None for a dense MLP
    """

    def __init__(self, config, weights, placement: Placement, scratch, inv_freq, *, many,
                 bind_decode, expert_counts):
        self.config, self.weights, self.placement = config, weights, placement
        self.scratch, self.inv_freq = scratch, inv_freq
        self.many, self.bind_decode = many, bind_decode
        self.expert_counts = expert_counts
        self.experts = expert_counts is not None
        self._last = (None, None)  # (rows, buffers) of the last call
        self._rows_step = None  # ((max_rows, version), the bound step of decode_rows)
        self.version = 0

    def _shapes(self, n: int, native: bool = False) -> dict:
        """Buffer shapes for n rows by name; ``native``: with those of a native decode step."""
        cfg = self.config
        shapes = {"h": (n, cfg.hidden_size), "q": (n, cfg.q_size), "k": (n, cfg.kv_size),
                  "v": (n, cfg.kv_size), "att": (n, cfg.q_size), "o": (n, cfg.hidden_size),
                  "x1": (n, cfg.hidden_size), "gate": (n, cfg.intermediate_size),
                  "up": (n, cfg.intermediate_size)}
        if native and self.experts:  # the native decode step's experts
            ex = self.weights.experts
            pairs, inter = n * ex.top_k, ex.intermediate_size
            shapes.update(moe_scores=(n, ex.num_experts), moe_x=(pairs, cfg.hidden_size),
                          moe_gate=(pairs, inter), moe_up=(pairs, inter),
                          moe_down=(pairs, cfg.hidden_size))
        return shapes

    def rows(self, n: int) -> dict:
        """The buffers for n rows by name (h, q, k, v, att, o, x1, gate, up), with the bound
        calls: qkv_proj and gate_up_proj (quantized CPU projections), decode_step (n == 1)."""
        rows, bufs = self._last
        if rows == n:
            return bufs
        native = n == 1 and self.bind_decode is not None
        bufs = {name: self.scratch.get(name, shape, placement=self.placement)
                for name, shape in self._shapes(n, native).items()}
        if self.many is not None:
            w = self.weights
            bufs["qkv_proj"] = self.many(((w.wq, w.bq, bufs["q"]), (w.wk, w.bk, bufs["k"]),
                                          (w.wv, w.bv, bufs["v"])))
            if not self.experts:
                bufs["gate_up_proj"] = self.many(((w.w_gate, None, bufs["gate"]),
                                                  (w.w_up, None, bufs["up"])))
        if native:
            bufs["expert_counts"] = self.expert_counts
            bufs["decode_step"] = self.bind_decode(self.config, self.weights, bufs, self.inv_freq)
        self._last = (n, bufs)
        self.version += 1
        return bufs

    def decode_step(self):
        """The bound native decode step of one row (on the 1-row buffers), or None."""
        return None if self.bind_decode is None else self.rows(1)["decode_step"]

    def decode_rows(self, max_rows: int):
        """A bound native decode step for up to max_rows rows, on buffers of its own in the
        scratch (kept while ``version`` stands), or None."""
        if self.bind_decode is None:
            return None
        have = self._rows_step
        if have is not None and have[0] == (max_rows, self.version):
            return have[1]
        bufs = {name: self.scratch.get(f"rows_{name}", shape)
                for name, shape in self._shapes(max_rows, True).items()}
        bufs["expert_counts"] = self.expert_counts
        step = self.bind_decode(self.config, self.weights, bufs, self.inv_freq, max_rows)
        self._rows_step = ((max_rows, self.version), step)
        return step
