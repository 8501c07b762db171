"""Going on with the survivors in their own processes: where a run may shrink over gloo (``backend``), Ray replaces
only a lost worker, and the others form the next generation of the process group at once (``member``), seated by a
keeper actor (``keeper``) by a pure rule (``generations``).

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints``,
``spotray.snapshots``, ``spotray.data``, ``spotray.tasks``, ``spotray.tracking``, ``spotray.step`` and
``spotray.worker``."""
