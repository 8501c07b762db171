"""In-memory snapshots of the training state between checkpoints: a file system over holders in each node's memory
(``memfs``), the holders themselves, Ray actors pinned to the nodes (``holders``), and the snapshots kept there with
the checkpoints' own commit rule (``store``).

May import: the base modules at the package's root, ``spotray.accounts`` and ``spotray.checkpoints``."""
