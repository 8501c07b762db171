"""Provisioning. ``infra.kernel`` is the shared kernel; ``infra.aws`` the AWS layer, beside ``cluster`` and
``monitoring``; the modules here are the composition root: the program, ``spotray plan`` and ``render``, the
policies and the provisioning half of the command line."""
