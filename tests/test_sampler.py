"""The data order: disjoint, covering shards per epoch, reshuffled by a shared seed, independent of process count."""

from __future__ import annotations

import pytest
import torch

from hpctrain.data.sampler import EpochPlan, mix_seed
from hpctrain.errors import UserError


def epoch_shards(plan: EpochPlan, epoch: int) -> list[list[int]]:
    order = plan.order(epoch)
    return [
        [i for step in range(plan.steps_per_epoch) for i in plan.rank_indices(order, step, rank).tolist()]
        for rank in range(plan.world_size)
    ]


@pytest.mark.parametrize("num_samples,batch,world", [(100, 10, 1), (100, 8, 4), (103, 12, 4), (7, 4, 2), (64, 64, 2)])
def test_shards_are_disjoint_and_cover_the_epoch(num_samples, batch, world):
    plan = EpochPlan(num_samples, batch, world, seed=3)
    shards = epoch_shards(plan, epoch=0)
    assert len({len(shard) for shard in shards}) == 1, "every rank takes the same number of samples"
    flat = [i for shard in shards for i in shard]
    assert set(flat) == set(range(num_samples))
    # Only the padding (at most world - 1 samples, as in DistributedSampler) repeats anything.
    assert len(flat) - num_samples == plan.padded_size - num_samples < world


def test_reshuffled_per_epoch_but_identical_for_the_same_seed():
    plan = EpochPlan(1000, 50, 2, seed=7)
    assert not torch.equal(plan.order(0), plan.order(1))
    assert torch.equal(plan.order(1), EpochPlan(1000, 50, 2, seed=7).order(1))
    assert not torch.equal(plan.order(1), EpochPlan(1000, 50, 2, seed=8).order(1))


def test_global_batches_do_not_depend_on_the_number_of_processes():
    one, four = EpochPlan(200, 16, 1, seed=1), EpochPlan(200, 16, 4, seed=1)
    order = one.order(2)
    for step in range(one.steps_per_epoch):
        together = torch.cat([four.rank_indices(four.order(2), step, r) for r in range(4)])
        assert torch.equal(together, one.rank_indices(order, step, 0))


def test_uneven_global_batch_is_rejected_with_a_fix():
    with pytest.raises(UserError, match="multiple of 3, e.g. 66"):
        EpochPlan(100, 64, 3, seed=0)


def test_mix_seed_separates_nearby_inputs():
    seeds = {mix_seed(0, epoch, step, rank) for epoch in range(3) for step in range(50) for rank in range(4)}
    assert len(seeds) == 3 * 50 * 4
    assert all(0 <= s < 2**63 for s in seeds)
