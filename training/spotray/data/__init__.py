"""Tokenized datasets: ``prepare`` turns text into token shards, ``TokenDataset`` reads them back.

Import from the submodules (``spotray.data.prepare``, ``spotray.data.dataset``) so that preparing data does
not import torch.

May import: the base modules at the package's root, ``spotray.accounts`` and ``spotray.checkpoints``.
"""

FORMATS = ("auto", "text", "jsonl", "json", "parquet")  # of an input file; json: one JSON array of records
