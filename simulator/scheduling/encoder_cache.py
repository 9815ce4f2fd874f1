"""The encoder cache: multimodal encoder outputs kept by content, counted in placeholder
tokens (vLLM v1's ``EncoderCacheManager``, docs/multimodal.md).

An entry is referenced by the sequences that still need it; once none does it stays cached,
freeable, and is evicted oldest-first only when an allocation needs its room. Evictions are
reported once (``take_freed``), as vLLM's scheduler reports ``free_encoder_mm_hashes``.
"""

from __future__ import annotations

from collections.abc import Hashable


class EncoderCache:
    """Encoder outputs by content id, with their referencing sequences and free room."""

    def __init__(self, cache_size: int) -> None:
        if not isinstance(cache_size, int) or cache_size <= 0:
            raise ValueError(f"encoder_cache_size must be a positive integer, got {cache_size!r}")
        self.cache_size = cache_size
        """Room in placeholder tokens (vLLM: encoder embeddings)."""
        self.num_free_slots = cache_size
        """Room not held by any entry."""
        self.num_freeable_slots = cache_size
        """Room free or held only by unreferenced entries (reclaimable by eviction)."""
        self._refs: dict[Hashable, set[object]] = {}
        self._sizes: dict[Hashable, int] = {}
        # per holder: the item positions it references, and how many of them per content (a
        # holder repeating an item keeps its reference until it passes the last occurrence)
        self._held: dict[object, set[int]] = {}
        self._counts: dict[object, dict[Hashable, int]] = {}
        # unreferenced entries in the order they became so (eviction order): content -> tokens
        self._freeable: dict[Hashable, int] = {}
        self._freed: list[Hashable] = []

    def __contains__(self, content: Hashable) -> bool:
        return content in self._refs

    def held(self, holder: object) -> list[int]:
        """The item positions ``holder`` references (in vLLM's set order)."""
        return list(self._held.get(holder, ()))

    def check_and_update(self, content: Hashable, holder: object, position: int) -> bool:
        """Whether ``content`` is cached; if so ``holder`` now references it (for its item at
        ``position``)."""
        refs = self._refs.get(content)
        if refs is None:
            return False
        if not refs:
            self.num_freeable_slots -= self._freeable.pop(content)
        refs.add(holder)
        self._hold(holder, position, content)
        return True

    def can_allocate(self, tokens: int, budget: int, scheduled: int) -> bool:
        """Whether an output of ``tokens`` fits the step's encoder ``budget`` and the cache
        beside the ``scheduled`` tokens its sequence already takes in the step; evicts the
        oldest freeable entries as needed when it does."""
        if tokens > budget:
            return False
        need = tokens + scheduled
        if need <= self.num_free_slots:
            return True
        if need > self.num_freeable_slots:
            return False
        freeable = self._freeable
        while need > self.num_free_slots:
            content = next(iter(freeable))
            self.num_free_slots += freeable.pop(content)
            del self._refs[content], self._sizes[content]
            self._freed.append(content)
        return True

    def allocate(self, content: Hashable, tokens: int, holder: object, position: int) -> None:
        """Take room for ``content``'s output (``can_allocate`` said yes), referenced by
        ``holder`` for its item at ``position``."""
        self._refs.setdefault(content, set()).add(holder)
        self._sizes.setdefault(content, tokens)
        self._hold(holder, position, content)
        self.num_free_slots -= tokens
        self.num_freeable_slots -= tokens
        assert self.num_free_slots >= 0 and self.num_freeable_slots >= 0

    def _hold(self, holder: object, position: int, content: Hashable) -> None:
        held = self._held.setdefault(holder, set())
        if position in held:
            return
        held.add(position)
        counts = self._counts.setdefault(holder, {})
        counts[content] = counts.get(content, 0) + 1

    def release(self, content: Hashable, holder: object, position: int) -> None:
        """``holder`` needs its item at ``position`` no more; once it needs ``content`` for
        none of its items and nobody else does, the entry becomes freeable."""
        held = self._held.get(holder)
        if held is not None and position in held:
            held.remove(position)
            counts = self._counts[holder]
            counts[content] -= 1
            if not counts[content]:
                del counts[content]
            if not held:
                del self._held[holder], self._counts[holder]
        refs = self._refs.get(content)
        if not refs or content in self._counts.get(holder, ()):
            return
        refs.discard(holder)
        if not refs:
            tokens = self._freeable[content] = self._sizes[content]
            self.num_freeable_slots += tokens

    def take_freed(self) -> list[Hashable]:
        """The contents evicted since the last call (and not cached again since)."""
        freed = [content for content in self._freed if content not in self._refs]
        self._freed = []
        return freed
