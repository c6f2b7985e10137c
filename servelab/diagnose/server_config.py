"""The deployment as the server says it is, instead of as estimated from its flags.

vLLM exports its cache configuration as the labels of one gauge,
`vllm:cache_config_info` (every CacheConfig field: num_gpu_blocks,
block_size, cache_dtype, enable_prefix_caching, ...). `bench` records
them in run.json; `diagnose` then sizes the KV cache from the blocks the
server really allocated (a CPU server with 2 GiB of KV is not the 14 GiB
a memory estimate gives) and knows whether prefix caching was on.
"""

from __future__ import annotations

from collections.abc import Mapping

from servelab.perf.engine_args import parse_engine_args


def engine_args_from_server(engine_args: str, labels: Mapping[str, str]) -> tuple[str, str | None]:
    """The user's flags, then the server's own KV figures (later flags win); and a note saying what was read, or
    None."""
    extra: list[str] = []
    blocks, block_size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    if blocks.isdigit() and int(blocks) > 0:
        extra.append(f"--num-gpu-blocks-override {blocks}")
    if block_size.isdigit():
        extra.append(f"--block-size {block_size}")
    dtype = labels.get("cache_dtype", "auto")
    if dtype not in ("", "auto", "None"):
        extra.append(f"--kv-cache-dtype {dtype}")
    caching = labels.get("enable_prefix_caching")
    if caching in ("True", "False"):
        extra.append("--enable-prefix-caching" if caching == "True" else "--no-enable-prefix-caching")
    if not extra:
        return engine_args, None
    merged = " ".join([engine_args, *extra]).strip()
    parse_engine_args(merged)  # the server's own values must parse as flags; a bad label is a bug to hear about
    return merged, (
        f"The KV cache and prefix caching are as the server reported them (vllm:cache_config_info): {' '.join(extra)}."
    )
