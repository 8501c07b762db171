import itertools

import pytest

from spotray.step.sampler import ElasticSampler


def test_order_is_a_function_of_seed_and_epoch_only():
    a, b = ElasticSampler(100, 10, seed=3), ElasticSampler(100, 10, seed=3)
    assert a.sample_ids(0, 250) == b.sample_ids(0, 250)
    assert ElasticSampler(100, 10, seed=4).sample_ids(0, 100) != a.sample_ids(0, 100)
    assert a.sample_ids(0, 100) != a.sample_ids(100, 100)  # a new epoch is a new permutation
    assert sorted(a.sample_ids(100, 100)) == list(range(100))


def test_ranks_partition_each_global_batch():
    sampler = ElasticSampler(97, 12, seed=0)
    for world in (1, 2, 3, 4, 6, 12):
        union = list(itertools.chain.from_iterable(sampler.rank_slice(24, r, world) for r in range(world)))
        assert union == sampler.sample_ids(24, 12)


@pytest.mark.parametrize("worlds", [(2, 1, 3), (4, 3, 2, 1), (3, 3, 6)])
def test_any_sequence_of_world_sizes_consumes_each_epoch_exactly_once(worlds):
    n, batch = 60, 12  # divisible by every world size used, as the config requires
    consumed: list[int] = []
    state = None
    for world in worlds:  # each world size trains 5 steps, then "stops"; the next resumes from the state
        ranks = [ElasticSampler(n, batch, seed=7) for _ in range(world)]
        for sampler in ranks:
            if state:
                sampler.load_state_dict(state)
        for _ in range(5):
            for r, sampler in enumerate(ranks):
                consumed.extend(sampler.next_batch(r, world))
        state = ranks[0].state_dict()
    steps = len(worlds) * 5
    assert state is not None
    assert state["consumed"] == steps * batch
    for start in range(0, len(consumed), n):
        epoch = consumed[start : start + n]
        assert len(epoch) == len(set(epoch))
    assert consumed == ElasticSampler(n, batch, seed=7).sample_ids(0, steps * batch)


def test_resuming_with_other_data_or_seed_is_refused():
    from spotray.errors import CheckpointError

    state = ElasticSampler(100, 10, seed=1).state_dict()
    with pytest.raises(CheckpointError, match="seed"):
        ElasticSampler(100, 10, seed=2).load_state_dict(state)
    with pytest.raises(CheckpointError, match="samples"):
        ElasticSampler(90, 10, seed=1).load_state_dict(state)
