"""Runs of a load against a target into a results directory: the `bench` and `simulate` verbs as library functions.

`request` holds the requests (each flag declared once, beside its field); `bench.run` and `simulate.run` are the
verbs; `load` the run they share (a point or a sweep); `run_info` the one builder of run.json's `run_info`;
`results` the directory read back. The CLI (servelab/cli/bench.py, simulate.py) and servelab.api are faces over them.
(Not `servelab.bench`: that name is the Python API's function.)
"""
