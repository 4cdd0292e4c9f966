"""Automatic prefix caching of KV blocks, as vLLM V1 does it (bookkeeping only: no tensors).

A drop-in for :class:`sim.serving.llm.kv.BlockManager` (same ``allocate``/``release``/
``used``), after vLLM's ``vllm/v1/core/block_pool.py`` (``BlockPool``), ``kv_cache_manager.py``
(``KVCacheManager.get_computed_blocks``/``allocate_slots``/``free``) and ``kv_cache_utils.py``
(``FreeKVCacheBlockQueue``, ``PrefixCacheStats``):

* A **full** block is named by a key that chains its parent's key and its content (here the
  trace's hash ids, see :mod:`sim.scenario.hash_trace`); a sequence's keys are ``Seq.hashes``
  (full prompt blocks only: output blocks and a partial last block stay private).
* At admission the longest prefix of the sequence's keys that is cached is reused, capped so
  that the last prompt token is always computed (``max_cache_hit_length = num_tokens - 1``).
* A block is cached as soon as it is allocated for tokens that fill it (vLLM caches in
  ``allocate_slots``, when the tokens are scheduled); equal keys may be cached twice (vLLM's
  ``BlockHashToBlockMap`` keeps duplicates; lookups take the first).
* Freed blocks keep their key and join the **tail** of the free queue, a request's blocks in
  reverse order (its last blocks are evicted first); a new block is taken from the **head**,
  evicting the key it held: least recently used first. A hit on a free block takes it out of
  the queue (``touch``); reference counts keep a block shared by running requests in use.

The prefix-cache counters are updated when a request is admitted, as vLLM 0.32 does
(``Scheduler.schedule`` calls ``record_prefix_cache_stats`` after ``allocate_slots``
succeeds: "Record at admission so unscheduled lookups are not counted"). Difference from
vLLM: no reserved null block (all ``num_blocks`` are usable, as in the plain manager; a
server's ``num_gpu_blocks`` is one more than its usable blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sim.serving.llm.kv import Seq


class KvInvariantError(RuntimeError):
    """The block pool's state is inconsistent: a bug."""


@dataclass
class PrefixCacheStats:
    """vLLM's ``PrefixCacheStats`` in tokens: a new request queries its prompt tokens and
    hits its cached prefix; a preempted request's re-admission counts apart.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evictions: int = 0
    cached_tokens: dict[int, int] = field(default_factory=dict)  # request id -> at admission

    @property
    def hit_rate(self) -> float:
        """The hit rate: hits / queries (nan without queries)."""
        return self.hits / self.queries if self.queries else float("nan")


class PrefixCachingBlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens with prefix reuse (module docstring).

    Attributes:
        held: Sequence id -> its blocks, in token order.
        stats: The prefix-cache counters.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.key = [-1] * num_blocks  # -1: not cached
        # the free queue (FreeKVCacheBlockQueue), head evicted first; ref 0 <=> in it. Its
        # head is the never-used blocks fresh..num_blocks-1 (freed blocks only ever join the
        # tail), kept as a counter; then free_queue, the freed blocks in order (memory grows
        # with the blocks used, not with the pool)
        self.fresh = 0
        self.free_queue: OrderedDict[int, None] = OrderedDict()
        self.cached: dict[int, dict[int, None]] = {}  # key -> blocks holding it
        self.held: dict[int, list[int]] = {}
        self.num_cached: dict[int, int] = {}  # sequence id -> its blocks already cached
        self.stats = PrefixCacheStats()
        self.in_use = 0  # blocks with a holder, counted apart from the queue (check_counts)
        self.version = 0  # bumped whenever the cache map changes (a key added or evicted)
        self._memo = (-1, -1, -1, 0)  # (sequence id, its tokens, version) -> hit blocks

    def __repr__(self) -> str:
        return f"PrefixCachingBlockPool({self.num_blocks}x{self.block_size})"

    @property
    def free(self) -> int:
        """Blocks with no holder (cached ones among them can be evicted)."""
        return self.num_blocks - self.fresh + len(self.free_queue)

    @property
    def used(self) -> int:
        """Blocks held by a sequence."""
        return self.num_blocks - self.free

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens of KV occupy."""
        return -(-tokens // self.block_size)

    # -- lookup and allocation ---------------------------------------------------------------
    def _hit_count(self, seq: Seq) -> int:
        memo = self._memo  # a waiting head is looked up at every step it waits
        if memo[0] == seq.id and memo[1] == seq.tokens and memo[2] == self.version:
            return memo[3]
        limit = (seq.tokens - 1) // self.block_size  # the last token is always computed
        cached = self.cached  # a key with no block left is removed from it
        n = 0
        for k in seq.hashes[:limit]:
            if k not in cached:
                break
            n += 1
        self._memo = (seq.id, seq.tokens, self.version, n)
        return n

    def _hit_blocks(self, seq: Seq, n: int) -> list[int]:
        return [next(iter(self.cached[k])) for k in seq.hashes[:n]]

    def cached_prefix_tokens(self, seq: Seq) -> int:
        """Tokens of ``seq``'s longest cached prefix (whole blocks; 0 while it holds blocks)."""
        if seq.id in self.held:
            return 0
        return self._hit_count(seq) * self.block_size

    def allocate(self, seq: Seq, new_tokens: int, cached_tokens: int = 0) -> bool:
        """Make room for ``new_tokens`` more tokens of ``seq`` after ``seq.computed`` (after
        ``cached_tokens`` of reused prefix at admission); False, with nothing changed, when
        too few blocks are free. The caller advances ``seq.computed`` by ``cached_tokens``.
        """
        admitting = seq.id not in self.held
        held = self.held.get(seq.id, [])
        hits: list[int] = []
        if cached_tokens:
            if not admitting or seq.computed:
                raise KvInvariantError(f"request {seq.id}: a prefix hit after admission")
            n = cached_tokens // self.block_size
            if n * self.block_size != cached_tokens or n > self._hit_count(seq):
                raise KvInvariantError(f"request {seq.id}: {cached_tokens} cached tokens "
                                       "asked, fewer cached")
            hits = self._hit_blocks(seq, n)
        total = (cached_tokens if admitting else seq.computed) + new_tokens
        need = self.blocks_for(total) - len(held) - len(hits)
        evictable_hits = sum(1 for b in hits if self.ref[b] == 0)
        if need > self.free - evictable_hits:
            return False
        for b in hits:  # touch: a free hit leaves the free queue
            if self.ref[b] == 0:
                del self.free_queue[b]
                self.in_use += 1
            self.ref[b] += 1
        fresh = [self._take() for _ in range(max(need, 0))]
        held = held + hits + fresh
        self.held[seq.id] = held
        if admitting:
            self.num_cached[seq.id] = len(hits)
            self._count(seq, cached_tokens)
        self._cache_full(seq, held, total)
        return True

    def _take(self) -> int:
        if self.fresh < self.num_blocks:  # a never-used block: nothing to evict
            b = self.fresh
            self.fresh += 1
            self.ref[b] = 1
            self.in_use += 1
            return b
        b, _ = self.free_queue.popitem(last=False)
        k = self.key[b]
        if k >= 0:  # evict the least recently used cached block
            holders = self.cached[k]
            del holders[b]
            if not holders:
                del self.cached[k]
            self.key[b] = -1
            self.stats.evictions += 1
            self.version += 1
        self.ref[b] = 1
        self.in_use += 1
        return b

    def _cache_full(self, seq: Seq, held: list[int], tokens: int) -> None:
        full = min(tokens // self.block_size, len(seq.hashes))
        for j in range(self.num_cached.get(seq.id, 0), full):
            b = held[j]
            if self.key[b] < 0:
                self.key[b] = seq.hashes[j]
                self.cached.setdefault(seq.hashes[j], {})[b] = None
                self.version += 1
        self.num_cached[seq.id] = max(full, self.num_cached.get(seq.id, 0))

    def _count(self, seq: Seq, hit_tokens: int) -> None:
        s = self.stats
        if seq.preemptions:
            s.preempted_requests += 1
            s.preempted_queries += seq.tokens
            s.preempted_hits += hit_tokens
        else:
            s.requests += 1
            s.queries += seq.tokens
            s.hits += hit_tokens
            s.cached_tokens[seq.id] = hit_tokens

    def release(self, seq: Seq) -> None:
        """Free ``seq``'s blocks: they keep their keys and join the free queue's tail, last
        block first (vLLM's ``KVCacheManager.free``).
        """
        blocks = self.held.pop(seq.id, [])
        self.num_cached.pop(seq.id, None)
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_queue[b] = None
                self.in_use -= 1

    # -- invariants --------------------------------------------------------------------------
    def check_counts(self) -> None:
        """The per-step check (O(1)): blocks in use, counted as they change hands, plus the
        free queue's length equal the pool's size.

        Raises:
            KvInvariantError: they do not.
        """
        if self.in_use + self.free != self.num_blocks or self.in_use < 0:
            raise KvInvariantError(f"{self.in_use} blocks in use + {self.free} "
                                   f"free != {self.num_blocks}")

    def check(self) -> None:
        """Full consistency check (O(blocks)): every block either free (reference count 0,
        in the queue once) or in use (count = its holders), never both; free + used =
        blocks; every cached key maps to blocks that hold it and back.

        Raises:
            KvInvariantError: naming the first inconsistency.
        """
        holders = [0] * self.num_blocks
        for sid, blocks in self.held.items():
            if len(set(blocks)) != len(blocks):
                raise KvInvariantError(f"request {sid} holds a block twice")
            for b in blocks:
                holders[b] += 1
        for b in range(self.num_blocks):
            in_queue = b >= self.fresh or b in self.free_queue
            if b >= self.fresh and (b in self.free_queue or self.key[b] >= 0):
                raise KvInvariantError(f"block {b}: never used, yet queued or cached")
            if self.ref[b] != holders[b]:
                raise KvInvariantError(f"block {b}: reference count {self.ref[b]}, "
                                       f"{holders[b]} holders")
            if in_queue == (self.ref[b] > 0):
                raise KvInvariantError(f"block {b}: reference count {self.ref[b]} and "
                                       f"{'in' if in_queue else 'not in'} the free queue")
            k = self.key[b]
            if k >= 0 and b not in self.cached.get(k, {}):
                raise KvInvariantError(f"block {b}: key {k} not in the cache map")
        for k, keyed in self.cached.items():
            for b in keyed:
                if self.key[b] != k:
                    raise KvInvariantError(f"cache map: key {k} -> block {b}, which holds "
                                           f"{self.key[b]}")
        in_use = sum(1 for h in holders if h > 0)
        if in_use != self.in_use or in_use + self.free != self.num_blocks:
            raise KvInvariantError(f"{in_use} blocks in use ({self.in_use} counted) + "
                                   f"{self.free} free != {self.num_blocks} blocks")
