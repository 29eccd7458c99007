"""StepBatch: one step of many sequences described once (vLLM's attention metadata, FlashInfer's
plan): which rows belong to which sequence, each row's position, where each row's K/V go and which
blocks each sequence attends over.

    batch = StepBatch.plan([(cache_a, 7), (cache_b, 1), (cache_c, 1)])   # rows per sequence
    # rows 0..6 are cache_a's positions seq_len..seq_len+6, row 7 cache_b's next token, ...
    for layer: ops.attend_step(batch, layer, q, k, v, ...)   # write K/V rows, attend
    batch.commit()      # after every layer: each cache advances by its rows
    batch.rollback()    # on error: every cache exactly as before

The slots a step writes are allocated before it is described: by the engine's scheduler
(``PagedKVCache.allocate_slots``), or by ``plan`` itself for stand-alone caches (all or nothing,
copying a shared block before it is written); ``describe`` only reads.  What depends on the
layer is only the pool's address table, so the CPU backend plans the step's attention once
(attention.RaggedStep, kept in ``attention_plans``) and every layer gathers its block addresses
in C.  The sequences share one pool; a layer on a GPU (or with its cache layer off the CPU)
runs the step sequence by sequence (DecoderLayer.forward_step).
"""

from __future__ import annotations

import numpy as np

from . import kernel_role
from .kvcache import PagedKVCache
from .profile import enabled as profiling_enabled


class StepBatch:
    def __init__(self, caches, counts, positions, seg_rows, seg_table, table_ids, row_block,
                 row_slot, starts, role: str = kernel_role.AUTO):
        self.caches = caches  # [S] PagedKVCache
        self.counts = counts  # [S] new rows per sequence
        self.positions = positions  # [T] int64 position of each row
        self.seg_rows = seg_rows  # [S+1] int64: sequence s owns rows seg_rows[s]:seg_rows[s+1]
        self.seg_table = seg_table  # [S] int64: its blocks start at table_ids[seg_table[s]]
        self.table_ids = table_ids  # [sum of blocks] int64 block ids, sequence after sequence
        self.row_block = row_block  # [T] int64 block id holding each row
        self.row_slot = row_slot  # [T] int64 slot of each row in its block
        self.starts = starts  # [S] each cache's seq_len before the step
        # what the rows are ("prompt", "decode" or "auto"): picks the projection kernels and
        # the fused decode path (hybrid/kernel_role.py; what keeps results batch-invariant)
        self.role = role
        # the profiler was on when the step was described: run op by op, so that every
        # Block/... region is timed (the fused native calls have no regions inside)
        self.profiled = profiling_enabled()
        c0 = caches[0]
        self.pool = c0.pool
        self.num_kv_heads, self.head_dim, self.block_size = c0.num_kv_heads, c0.head_dim, c0.block_size
        self.dtype, self.kv_code = c0.dtype, c0.kv_code
        self.head_stride = c0.head_stride
        self.last_rows = seg_rows[1:] - 1  # [S] the row whose logits each sequence samples from
        self.attention_plans: dict = {}  # the CPU backend's plan of this step's attention

    @property
    def num_rows(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def plan(cls, items, role: str = kernel_role.AUTO) -> "StepBatch":
        """items: [(cache, n_rows)] with distinct caches over one pool and n_rows >= 1.  Takes
        the blocks every row needs that are not allocated yet (all or nothing; the engine's
        scheduler has allocated them already), then describes the step.  Raises
        (PoolExhaustedError, CacheCapacityError, ValueError) with nothing taken."""
        cls._check(items, role)
        done = []
        try:
            for c, n in items:
                c.allocate_slots(int(n))
                done.append(c)
        except BaseException:
            for c in done:  # the slots past the committed tokens go back
                c.truncate(c.seq_len)
            raise
        return cls._describe(items, role)

    @staticmethod
    def _check(items, role: str) -> None:
        kernel_role.check(role)
        caches = [c for c, _ in items]
        if not caches:
            raise ValueError("a step needs at least one sequence")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("a sequence appears twice in one step")
        for c, n in items:
            if not isinstance(c, PagedKVCache):
                raise TypeError(f"expected PagedKVCache, got {type(c).__name__}")
            if int(n) < 1:
                raise ValueError(f"every sequence of a step needs at least one row, got {n}")
            if c.pool is not caches[0].pool:
                raise ValueError("the sequences of one step must share one KV pool")
            if c.holds_uncommitted():
                raise ValueError("a cache holds uncommitted tokens; commit or truncate before "
                                 "the next step")

    @classmethod
    def describe(cls, items, role: str = kernel_role.AUTO) -> "StepBatch":
        """The description of a step whose slots are all allocated already (the scheduler's
        ``allocate_slots``): reads the caches, takes nothing."""
        cls._check(items, role)
        return cls._describe(items, role)

    @classmethod
    def _describe(cls, items, role: str) -> "StepBatch":
        """describe for items already checked (plan checks them before it allocates)."""
        caches = [c for c, _ in items]
        counts = [int(n) for _, n in items]
        starts = [c.seq_len for c in caches]
        for c, s, n in zip(caches, starts, counts):
            if s + n > c.allocated_tokens():
                raise ValueError(f"a step of {n} rows after {s} tokens needs slots the cache "
                                 f"has not allocated (it holds {c.allocated_tokens()})")
        if len(caches) == 1:  # one sequence (a decode step, a prompt): the same arrays, cheaper
            return cls._one(caches[0], counts[0], starts[0], role)
        bs = caches[0].block_size
        positions = np.concatenate([np.arange(s, s + n, dtype=np.int64)
                                    for s, n in zip(starts, counts)])
        seg_rows = np.zeros(len(caches) + 1, dtype=np.int64)
        seg_rows[1:] = np.cumsum(counts)
        nblocks = [-(-(s + n) // bs) for s, n in zip(starts, counts)]
        seg_table = np.zeros(len(caches), dtype=np.int64)
        seg_table[1:] = np.cumsum(nblocks)[:-1]
        table_ids = np.concatenate([np.asarray(c.block_ids[:nb], dtype=np.int64)
                                    for c, nb in zip(caches, nblocks)])
        seq_of_row = np.repeat(np.arange(len(caches)), counts)
        row_block = table_ids[seg_table[seq_of_row] + positions // bs]
        return cls(caches, counts, positions, seg_rows, seg_table, table_ids, row_block,
                   positions % bs, starts, role)

    @classmethod
    def _one(cls, cache: PagedKVCache, n: int, start: int, role: str) -> "StepBatch":
        """plan's arrays for one sequence of n rows from position ``start`` (blocks taken)."""
        bs = cache.block_size
        table_ids = np.array(cache.block_ids[:-(-(start + n) // bs)], dtype=np.int64)
        if n == 1:  # a decode row: its block is the table's last
            positions = np.array([start], dtype=np.int64)
            row_block, row_slot = table_ids[-1:], np.array([start % bs], dtype=np.int64)
        else:
            positions = np.arange(start, start + n, dtype=np.int64)
            row_block, row_slot = table_ids[positions // bs], positions % bs
        return cls([cache], [n], positions, np.array([0, n], dtype=np.int64),
                   np.zeros(1, dtype=np.int64), table_ids, row_block, row_slot, [start], role)

    def wrote_layer(self, layer: int) -> None:
        """Every sequence's ``layer`` now holds its new rows."""
        for c, n in zip(self.caches, self.counts):
            c.mark_written(n, (layer,))

    def wrote_layers(self, layers: range) -> None:
        """These layers of every sequence now hold their new rows."""
        for c, n in zip(self.caches, self.counts):
            c.mark_written(n, layers)

    def commit(self) -> None:
        for c, n in zip(self.caches, self.counts):
            c.commit(n)

    def rollback(self) -> None:
        """Undo the step: every cache back to its committed tokens, and the blocks past them
        back to the pool."""
        for c in self.caches:
            c.truncate(c.seq_len)
