"""`servelab bench`: measure a real OpenAI-compatible server with the flags of `vllm bench serve`.

The flags are the request's fields (servelab.runs.request: ServerFlags, and the shared LoadFlags); the verb is
servelab.runs.bench.run; this face parses, calls it and shows what it returns.
"""

from __future__ import annotations

from servelab.runs.request import BenchRequest, ServerFlags
from servelab.cli import app
from servelab.flags.options import LoadFlags, flag_block, load_options
from servelab.cli.report import ReportFlag
from servelab.report.console import make_console


@app.command()
@flag_block("server", ServerFlags)
@load_options
def bench(report: ReportFlag = False, *, load: LoadFlags, server: ServerFlags) -> None:
    """Measure a running server: latency, throughput and goodput under the load you describe.

    Exit codes: 0 measured; 2 bad input, or a server that fails the pre-flight check (nothing is sent), or a server that refused every request (its first error message is printed); 3 disturbed: the run ended, but requests failed because the server refused or dropped connections (killed, crashed) or a client worker died, so the numbers do not describe the server; 130 interrupted (Ctrl-C, SIGTERM); 1 a bug in servelab (reported with its traceback). Records, summary and timeline are written in every case but 1 and a refusal before the run.
    """  # noqa: E501  (one paragraph: the help keeps the docstring's line breaks)
    from servelab.runs.bench import masked_argv, run  # the client, the runner and the tables: not for --help
    from servelab.cli.run_and_show import progress, say, show

    out = make_console(stderr=load.json)
    request = BenchRequest(server, load, argv=masked_argv(server.api_key))
    show(run(request, say=say(out), observe=progress(out)), load, out, report=report)
