"""The run's accounts: the ledger every attempt writes to the run's storage (``ledger``), and the figures computed
from it, once, for everything a user sees: where the wall time went (``goodput``), the nodes the run held
(``node_records``), what an instance costs per hour (``prices``; ``aws_prices`` is ``spotray prices``) and what the
run cost (``cost``).

May import: the base modules at the package's root (``config``, ``errors``, ``storage``, ``renames``, ``formats``,
``ray_local``)."""
