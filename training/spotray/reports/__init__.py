"""What a user reads about runs, live or finished, from their storage alone: ``spotray status`` (``status``),
``spotray cost`` over many runs (``cost_report``), and a finished run's interruption table and loss curve
(``summary``).

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints``, ``spotray.data``,
``spotray.tasks``, ``spotray.tracking``, ``spotray.step`` and ``spotray.worker``."""
