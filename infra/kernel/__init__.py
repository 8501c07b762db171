"""The shared kernel: stack config, pinned versions, shared names and the Pulumi helpers every layer uses.
Leaf modules: they import nothing from ``infra.aws``, ``cluster``, ``monitoring`` or the root."""
