"""Which training samples each rank sees at each step: pure arithmetic on (seed, epoch, step).

The global batch order of an epoch is one permutation drawn from a generator seeded by (seed, epoch), the same on
every rank. Global batch k is split into world_size equal, disjoint slices, one per rank. So, like
DistributedSampler: the ranks' shards are disjoint and together cover the epoch, and they are reshuffled every epoch
by a shared seed. Unlike it, the order depends only on the global batch, not on the number of processes, so a
4-process run and a 1-process run with the same global batch see the same batches, and a run resumed mid-epoch
knows its position from the step counter alone. (One exception: a last partial batch of one sample per process
joins the batch before it, see steps_per_epoch; whether that happens depends on the number of processes.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpctrain.errors import UserError


@dataclass(frozen=True)
class EpochPlan:
    num_samples: int
    global_batch: int
    world_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.global_batch % self.world_size:
            raise UserError(
                f"--batch-size {self.global_batch} is the global batch and must split evenly over "
                f"{self.world_size} processes; use a multiple of {self.world_size}, e.g. "
                f"{_round_up(self.global_batch, self.world_size)}"
            )
        if self.num_samples < self.world_size:
            raise UserError(
                f"only {self.num_samples} training samples for {self.world_size} processes; "
                "raise --train-limit or use fewer processes"
            )

    @property
    def padded_size(self) -> int:
        """Samples per epoch after padding (with the epoch's first samples) to a multiple of the world size."""
        return _round_up(self.num_samples, self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        """Global batches per epoch. A last partial batch that would give each process a single sample is folded
        into the batch before it: BatchNorm cannot train on one sample ("Expected more than 1 value per channel"),
        so such a batch would stop every run of this size at the same step, resume after resume. Folding (rather
        than dropping) keeps every sample in the epoch; that one step is world_size samples larger."""
        steps = -(-self.padded_size // self.global_batch)
        if steps > 1 and self.padded_size - (steps - 1) * self.global_batch == self.world_size:
            steps -= 1
        return steps

    @property
    def largest_rank_batch(self) -> int:
        """The most samples one process gets in a step (the folded last step's, if any)."""
        last = self.padded_size - (self.steps_per_epoch - 1) * self.global_batch
        return max(self.global_batch, last) // self.world_size

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's global sample order (CPU int64), padded so the last batch splits evenly."""
        generator = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
        order = torch.randperm(self.num_samples, generator=generator)
        pad = self.padded_size - self.num_samples
        return torch.cat([order, order[:pad]]) if pad else order

    def rank_indices(self, order: torch.Tensor, step_in_epoch: int, rank: int) -> torch.Tensor:
        """This rank's slice of global batch `step_in_epoch` of `order`."""
        start = step_in_epoch * self.global_batch
        last = step_in_epoch == self.steps_per_epoch - 1
        batch = order[start:] if last else order[start : start + self.global_batch]  # the last takes the rest
        per_rank = batch.numel() // self.world_size
        return batch[rank * per_rank : (rank + 1) * per_rank]


def mix_seed(*parts: int) -> int:
    """Combine integers into one 63-bit seed (distinct inputs give unrelated generators)."""
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = ((value ^ (part & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        value ^= value >> 31
    return value & 0x7FFFFFFFFFFFFFFF


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
