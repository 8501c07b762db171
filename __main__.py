"""The Pulumi program: read the stack config once, compose the components, export the outputs."""

import pulumi

from infra.kernel.config import from_pulumi
from infra.program import deploy
from spotray.errors import SpotrayError

try:
    config = from_pulumi()
except SpotrayError as exc:
    raise pulumi.RunError(str(exc)) from None
for key, value in deploy(config).items():
    pulumi.export(key, value)
