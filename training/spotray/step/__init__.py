"""What a training step is made of: which samples each rank takes, exactly once per epoch at any world size
(``sampler``), moving and splitting a batch (``batches``), the optimizer and its schedule (``optim``), DDP or FSDP2
(``parallel``), and the evaluation on the validation set between steps (``evaluation``).

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints``, ``spotray.data``,
``spotray.tasks`` and ``spotray.tracking``."""
