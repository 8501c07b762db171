"""Text corpora the tests make themselves (nothing is downloaded)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("spot preempt node ray train shard token model loss step batch drain grace save load resume "
         "gpu cpu storage bucket commit marker rank world epoch sample").split()


def write_corpus(directory: Path, documents: int = 40, words_per_doc: int = 400, seed: int = 0) -> str:
    """Deterministic text files with some structure (a small Markov-ish word stream)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        words = [rng.choice(WORDS)]
        for _ in range(words_per_doc):
            nxt = WORDS[(WORDS.index(words[-1]) * 7 + rng.randint(0, 3)) % len(WORDS)]
            words.append(nxt)
        (directory / f"doc{d:03d}.txt").write_text(" ".join(words) + "\n")
    return str(directory)
