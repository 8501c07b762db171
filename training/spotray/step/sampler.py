"""A deterministic, resumable, elastic sampler.

The global order is a function of (seed, epoch) alone: position p of the infinite sample stream is
``permutation(seed, p // N)[p % N]``. A step consumes the next ``global_batch_size`` positions and rank r
takes its contiguous slice, so the only state is the number of positions consumed. Resuming at any world
size continues the same stream: every sample of an epoch is consumed exactly once.
"""

from __future__ import annotations

import numpy as np

from spotray.errors import CheckpointError


class ElasticSampler:
    def __init__(self, num_samples: int, global_batch_size: int, seed: int):
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.consumed = 0
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            self._epoch_cache = (epoch, rng.permutation(self.num_samples))
        return self._epoch_cache[1]

    def sample_ids(self, start: int, count: int) -> list[int]:
        """Sample ids at stream positions [start, start + count)."""
        ids: list[int] = []
        position = start
        while len(ids) < count:
            epoch, offset = divmod(position, self.num_samples)
            take = min(count - len(ids), self.num_samples - offset)
            ids.extend(self.permutation(epoch)[offset : offset + take].tolist())
            position += take
        return ids

    def rank_slice(self, step_start: int, rank: int, world_size: int) -> list[int]:
        """The ids rank ``rank`` trains on in the global batch that starts at stream position ``step_start``."""
        per_rank = self.global_batch_size // world_size
        return self.sample_ids(step_start + rank * per_rank, per_rank)

    def next_batch(self, rank: int, world_size: int) -> list[int]:
        ids = self.rank_slice(self.consumed, rank, world_size)
        self.consumed += self.global_batch_size
        return ids

    @property
    def epoch(self) -> int:
        return self.consumed // self.num_samples

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "seed": self.seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        if int(state["num_samples"]) != self.num_samples or int(state["seed"]) != self.seed:
            raise CheckpointError(
                f"checkpoint was trained on {state['num_samples']} samples with seed {state['seed']}, this run has "
                f"{self.num_samples} samples and seed {self.seed}: resume with the same data.path, train.seq_len and "
                "seed, or start a new run.name"
            )
        self.consumed = int(state["consumed"])
