"""Tokenized datasets: ``prepare`` turns text into token shards, ``TokenDataset`` reads them back.

Import from the submodules (``training.data.prepare``, ``training.data.dataset``) so that preparing data does
not import torch.
"""
