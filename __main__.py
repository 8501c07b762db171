"""The Pulumi program: read the stack config once, compose the components, export the outputs."""

import pulumi

from spotray.errors import SpotrayError
from spotray.infra.kernel.config import from_pulumi
from spotray.infra.program import deploy

try:
    config = from_pulumi()
except SpotrayError as exc:
    raise pulumi.RunError(str(exc)) from None
for key, value in deploy(config).items():
    pulumi.export(key, value)
