"""`diagnose`: what limits a deployment, the evidence, the ceilings, and what to change.

`run(DiagnoseRequest) -> Diagnosis` is the verb (servelab/diagnose/request.py); `servelab diagnose` and
`servelab.diagnosis()` are faces over it. The verb's modules load on its first call, so the command line's help,
which reads this package's vocabularies (regions, scripts), imports no simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.diagnose.request import DeploymentBuilder, DiagnoseRequest
    from servelab.schemas.diagnosis import Diagnosis


def run(
    request: DiagnoseRequest, build: DeploymentBuilder | None = None, warn: Callable[[str], None] | None = None
) -> Diagnosis:
    """The diagnosis `request` asks for. `build` turns the deployment's words into a deployment (default: the GPU and
    model catalogues; the CLI's also reads calibration profiles); `warn` hears what a reader must see before the
    answer (the engine recorded elsewhere than asked, a run cut short)."""
    from servelab.diagnose.request import diagnose, from_catalogue

    return diagnose(request, build or from_catalogue, warn or (lambda _: None))
