"""Experiment trackers (MLflow, Weights & Biases, TensorBoard): the driver logs one tracker run per spotray run,
read from the run's ledger, so workers need no tracker library or credentials (see ``follower.py``).

May import: the base modules at the package's root and ``spotray.accounts``."""

from spotray.tracking.follower import Follower
from spotray.tracking.libraries import check_installed
from spotray.tracking.state import read_gaps

__all__ = ["Follower", "check_installed", "read_gaps"]
