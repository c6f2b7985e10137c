"""The workload's names and bounds that the command line shows in its help, kept apart from the generators.

The generators need numpy; `servelab VERB --help` lists these names and defaults without importing it.
"""

from __future__ import annotations

DATASETS = ("random", "prefix", "multiturn", "sharegpt", "jsonl")
"""`--dataset-name`."""
FILE_DATASETS = ("sharegpt", "jsonl")
"""The datasets read from `--dataset-path`: their lengths come from the file."""
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
"""The shapes of a length distribution (`--length-distribution`)."""
RAMPS = ("linear", "exponential")
"""`--ramp-up-strategy`, as `vllm bench serve` names them."""
DURATION_REQUEST_CAP = 1_000_000
"""A `--duration` run without a rate (closed loop) could ask for requests forever; this bounds it (and --num-prompts)."""
PLAN_TOKEN_LIMIT = 100_000_000
"""Prompt + output tokens one plan may hold unless --max-plan-tokens says more: prompts are materialised as token
ids and every output token's arrival is recorded, so this is ~1 GB of memory, far beyond a day's benchmark."""
