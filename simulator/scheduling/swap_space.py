"""The CPU memory a scheduler swaps preempted sequences' KV to (vLLM v0's swap space,
``--swap-space`` GiB per GPU): counted in blocks of the GPU's size, with the sequences swapped
out waiting in it for their turn, and the bytes copied each way since the engine last asked."""

from __future__ import annotations

from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence


class SwapSpace:
    """CPU blocks for swapped-out KV, the swapped sequences and the bytes copied."""

    __slots__ = (
        "num_blocks",
        "bytes_per_block",
        "bandwidth",
        "num_free",
        "held",
        "queue",
        "out_bytes",
        "in_bytes",
        "num_fallbacks",
    )

    def __init__(
        self, num_blocks: int, bytes_per_block: int, bandwidth: float, priority: bool
    ) -> None:
        if num_blocks < 0 or bytes_per_block <= 0 or not bandwidth > 0:
            raise ValueError("a swap space needs >= 0 blocks of > 0 bytes and a link > 0 B/s")
        self.num_blocks = num_blocks
        """CPU blocks in all (each of ``bytes_per_block`` bytes, a GPU block's KV)."""
        self.bytes_per_block = bytes_per_block
        self.bandwidth = bandwidth
        """Bytes per second the host link copies one way (all the replica's GPUs at once)."""
        self.num_free = num_blocks
        """CPU blocks no swapped sequence holds."""
        self.held: dict[Sequence, int] = {}
        """The CPU blocks each swapped-out sequence holds."""
        self.queue: FCFSQueue | PriorityQueue = PriorityQueue() if priority else FCFSQueue()
        """Swapped-out sequences in the order they resume (as the waiting queue's)."""
        self.out_bytes = self.in_bytes = 0
        """Bytes copied to and from the CPU since ``take_moved``."""
        self.num_fallbacks = 0
        """Preemptions that recomputed because the swap space was full."""

    def swap_out(self, seq: Sequence, num_blocks: int) -> bool:
        """Copy the ``num_blocks`` blocks of KV ``seq`` computed to CPU blocks and queue it
        (at the head, as a preempted sequence of the waiting queue), if they fit; else False
        (counted as a fallback: the caller recomputes it, as when nothing is swapped)."""
        if num_blocks > self.num_free:
            self.num_fallbacks += 1
            return False
        self.num_free -= num_blocks
        self.held[seq] = num_blocks
        self.out_bytes += num_blocks * self.bytes_per_block
        self.queue.prepend(seq)
        return True

    def swap_in(self) -> Sequence:
        """Copy the head's KV back to the GPU (its blocks there are the caller's): dequeue it
        and free its CPU blocks."""
        seq = self.queue.pop()
        num_blocks = self.held.pop(seq)
        self.num_free += num_blocks
        self.in_bytes += num_blocks * self.bytes_per_block
        return seq

    def take_moved(self) -> tuple[int, int]:
        """Bytes swapped out and in since the last call."""
        moved = self.out_bytes, self.in_bytes
        self.out_bytes = self.in_bytes = 0
        return moved

    def copy_time(self, nbytes: int) -> float:
        """Seconds the host link takes to copy ``nbytes``."""
        return nbytes / self.bandwidth
