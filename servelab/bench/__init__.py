"""The `bench` and `simulate` verbs as library functions: a request in, a results directory written and read back.

`servelab.bench.request` holds the requests (each flag declared once, beside its field), `servelab.bench.verbs` the
verbs, `servelab.bench.run_info` the one builder of run.json's `run_info`; the CLI (servelab/cli/bench.py,
simulate.py) and servelab.api are faces over them.
"""
