"""The flags every face shares, declared once with their help: the load (`LoadFlags`), the deployment's words, and
the checks typer runs on each value.

Below the verbs (servelab/runs, tune, diagnose, calibrate, compare) that build their requests from these blocks, and
above the layers they describe, so the CLI and the Python API read the same fields without a verb importing the CLI.
"""
