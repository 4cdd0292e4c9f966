"""The paged KV cache's block accounting (pure bookkeeping: no tensors, no clock).

A sequence whose KV holds ``t`` tokens occupies ``ceil(t / block_size)`` blocks. The live
engine's cache and the simulator use the same accounting, so both run out at the same step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Seq:
    """One request's progress through the engine.

    Attributes:
        id: Request id (row of the request table).
        arrival_s: Arrival time.
        prompt: Prompt tokens.
        output: Output tokens to generate (its ``max_tokens``; generated to exactly this).
        priority: Priority level (0 first).
        computed: Tokens whose KV has been computed (reset to 0 by a preemption).
        emitted: Output tokens produced so far (kept through a preemption).
        preemptions: How often it was preempted.
        work: Tokens computed for it in all, recomputation included.
        hashes: Keys of its full prompt blocks, each naming its prefix (prefix caching;
            empty: nothing to share).
    """

    id: int
    arrival_s: float
    prompt: int
    output: int
    priority: int = 0
    computed: int = 0
    emitted: int = 0
    preemptions: int = 0
    work: int = 0
    hashes: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens known so far: the prompt and the outputs produced."""
        return self.prompt + self.emitted

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next output token can be sampled."""
        return self.prompt + self.emitted - self.computed

    @property
    def decoding(self) -> bool:
        """Past the prompt (and any recomputation): the next step computes one token."""
        return self.emitted > 0 and self.computed == self.prompt + self.emitted - 1


@dataclass(slots=True)
class BlockManager:
    """Blocks of ``block_size`` tokens; ``num_blocks`` in all.

    Attributes:
        num_blocks: Blocks in the cache.
        block_size: Tokens per block.
        free: Blocks not held by any sequence.
        held: Sequence id -> blocks it holds.
    """

    num_blocks: int
    block_size: int
    free: int = -1
    held: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.free < 0:
            self.free = self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens of KV occupy."""
        return -(-tokens // self.block_size)

    def cached_prefix_tokens(self, seq: Seq) -> int:
        """Tokens reusable from a prefix cache: none without prefix caching."""
        return 0

    def allocate(self, seq: Seq, new_tokens: int, cached_tokens: int = 0) -> bool:
        """Make room for ``new_tokens`` more tokens of ``seq``'s KV; False when not enough
        blocks are free (nothing is allocated then). ``cached_tokens`` is always 0 here
        (see :class:`sim.serving.llm.prefix_cache.PrefixCachingBlockPool`).
        """
        need = self.blocks_for(seq.computed + new_tokens) - self.held.get(seq.id, 0)
        if need <= 0:
            return True
        if need > self.free:
            return False
        self.free -= need
        self.held[seq.id] = self.held.get(seq.id, 0) + need
        return True

    def release(self, seq: Seq) -> None:
        """Free every block ``seq`` holds."""
        self.free += self.held.pop(seq.id, 0)

    @property
    def used(self) -> int:
        """Blocks held."""
        return self.num_blocks - self.free
