"""`servelab simulate`: the load `bench` would send, served by simulated engines on a GPU cost model.

The load flags are bench's own (`@load_options`), and the results directory
is bench's format with `"source": "sim"` and the deployment in run.json, so
every later verb reads a simulated run exactly like a measured one. The verb is
servelab.runs.simulate.run; this face parses, calls it and shows what it returns.
"""

from __future__ import annotations

import sys

from servelab.runs.request import DeploymentFlags, SimulateRequest
from servelab.cli import app
from servelab.flags.options import LoadFlags, flag_block, load_options
from servelab.cli.report import ReportFlag
from servelab.report.console import make_console


@app.command()
@flag_block("deployment", DeploymentFlags)
@load_options
def simulate(report: ReportFlag = False, *, load: LoadFlags, deployment: DeploymentFlags) -> None:
    """Predict latency, throughput and goodput of a vLLM deployment under the load you describe, without a GPU."""
    from servelab.runs.simulate import run as run_simulation  # the runner and the tables: not for --help
    from servelab.cli.run_and_show import progress, say, show

    out = make_console(stderr=load.json)
    request = SimulateRequest(deployment, load, argv=tuple(sys.argv))
    show(
        run_simulation(request, say=say(out), observe=progress(out)),
        load,
        out,
        report=report,
        title="Simulated serving result",
    )
