"""The driver of ``spotray train``: the run on Ray Train's ``TorchTrainer`` and its summary (``launch``), what
travels to the workers (``runtime_env``), the terminal and the run's log file (``console``), the live progress lines
(``progress``), whether Ray can place the worker group (``placement``) and the watch on the Ray head
(``head_watch``).

May import: the base modules at the package's root and every package below it (``accounts``, ``checkpoints``,
``data``, ``tasks``, ``tracking``, ``step``, ``worker``, ``survivors``, ``reports``, ``planning``). The root's
commands (``cli``, ``demo``, ``export``), ``bench``, ``drills`` and ``examples`` import it, never the reverse."""
