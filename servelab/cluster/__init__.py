"""servelab on a Ray cluster (the optional `servelab[ray]` extra): the same single-machine code, run as Ray tasks.

Nothing here is imported unless a command is given `--ray-address`, so the
single-machine path never loads Ray (tests/test_cluster.py checks it).
"""
