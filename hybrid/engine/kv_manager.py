"""KVCacheManager: the engine's KV blocks behind one public interface (vLLM's KVCacheManager over
its BlockPool).  The scheduler asks it whether blocks are free and allocates a request's slots
through it while it plans a step; the pool (hybrid/kvpool.py) only keeps the books.

    kv = KVCacheManager(pool, max_tokens=4096, salt=b"model")
    kv.admit(req)                  # a cache for req, starting with its cached prompt prefix
    kv.blocks_needed(req, n)       # new blocks n more tokens would take
    kv.tokens_that_fit(req, k)     # tokens req's cache holds with k more blocks
    kv.allocate_slots(req, n)      # take them (the step then only describes them)
    kv.cache_prompt_blocks(req)    # its newly computed full prompt blocks join the prefix cache
    kv.release_out_of_window(req)  # blocks no layer's sliding window reaches go back
    kv.free(req)                   # every block back (finished, aborted, preempted)
"""

from __future__ import annotations

from ..kvcache import PagedKVCache
from ..kvpool import KVBlockPool, prefix_hashes


class KVCacheManager:
    def __init__(self, pool: KVBlockPool, max_tokens: int, salt: bytes,
                 window: "int | None" = None):
        self.pool = pool
        self.window = window  # every layer reads only the last `window` positions (None: some layer reads all)
        self.block_size = pool.block_size
        self.max_tokens = max_tokens  # per sequence (the model's context)
        self.salt = salt

    def admit(self, req) -> None:
        """Give req a cache over the pool, starting with the longest run of its prompt's full
        blocks that the prefix cache holds (at least one prompt token is left to compute)."""
        cache = PagedKVCache.on(self.pool, max_tokens=self.max_tokens)
        n_full = (len(req.prompt) - 1) // self.block_size
        hashes = prefix_hashes(req.prompt, self.block_size, self.salt, n_full)
        hit = self.pool.match_prefix(hashes)
        if hit:
            cache.adopt_prefix(hit)
        req.cache = cache
        req.computed = len(hit) * self.block_size
        req.registered = len(hit)
        req.cached_tokens = req.computed

    def blocks_needed(self, req, n: int) -> int:
        """New blocks req needs to hold n more tokens."""
        have = 0 if req.cache is None else len(req.cache.block_ids)
        return max(0, -(-(req.computed + n) // self.block_size) - have)

    def can_allocate(self, n_blocks: int) -> bool:
        return self.pool.can_allocate(n_blocks)

    def tokens_that_fit(self, req, n_blocks_free: int) -> int:
        """How many more tokens req's cache holds with ``n_blocks_free`` more blocks."""
        have = 0 if req.cache is None else len(req.cache.block_ids)
        return (have + n_blocks_free) * self.block_size - req.computed

    def blocks_available(self) -> "int | None":
        """Blocks an allocation can take now (None: the pool grows without limit)."""
        return self.pool.num_available

    def allocate_slots(self, req, n: int) -> None:
        """Take the blocks for req's next n tokens (all or nothing)."""
        req.cache.allocate_slots(n)

    def free(self, req) -> None:
        """Every block of req back to the pool (registered prompt blocks stay cached)."""
        if req.cache is not None:
            req.cache.close()
            req.cache = None
        req.computed = 0
        req.registered = 0

    def cache_prompt_blocks(self, req) -> None:
        """Register req's newly completed full prompt blocks in the prefix cache."""
        full = min(req.computed, len(req.prompt)) // self.block_size
        if full <= req.registered:
            return
        hashes = prefix_hashes(req.prompt, self.block_size, self.salt, full)
        blocks = req.cache.block_ids
        for i in range(max(req.registered, req.cache.released_tokens // self.block_size), full):
            self.pool.register(blocks[i], hashes[i])
        req.registered = full

    def release_out_of_window(self, req) -> None:
        """Give back the blocks of req that no future token's window reaches: the next token
        (position ``req.computed``) sees positions computed - window + 1 onwards.  Registered
        prompt blocks stay in the prefix cache."""
        if self.window is not None and req.cache is not None:
            req.cache.release_before(req.computed - self.window + 1)
