"""Whether a run should use spot, before it starts: the planner's model of goodput, wall time and cost under
interruptions (``planner``), its inputs measured from a finished run's ledger (``calibration``) and the
``spotray estimate`` command (``estimate``).

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints``, ``spotray.data``,
``spotray.tasks``, ``spotray.tracking``, ``spotray.step``, ``spotray.worker`` and ``spotray.reports``."""
