"""An attempt on the workers: what a worker is given and what it records (``attempt``), spotray's training loop
(``loop``), when it saves and asks about preemptions (``cadence``), a user's own script run in its place
(``user_script``) with the calls that script makes (``session``), rank 0's live view (``telemetry``) and each rank's
memory figures (``memory``).

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints``, ``spotray.data``,
``spotray.tasks``, ``spotray.tracking`` and ``spotray.step``."""
