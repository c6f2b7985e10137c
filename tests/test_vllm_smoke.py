"""The real vLLM fixture works: it streams, honours ignore_eos, reports usage, and can be reconfigured."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

PROMPT_IDS = list(range(100, 132))


async def stream_completion(base_url: str, body: dict[str, Any]) -> list[dict[str, Any] | str]:
    """POST a streaming completion and return its SSE data payloads, decoded, '[DONE]' kept as a string."""
    events: list[dict[str, Any] | str] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
            async for raw in response.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    data = line.removeprefix("data: ")
                    events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def get_json(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(url) as response:
            assert response.status == 200
            return await response.json()


@pytest.mark.vllm
def test_streams_token_id_prompt_with_usage(vllm_server) -> None:
    body = {
        "model": vllm_server.model_name,
        "prompt": PROMPT_IDS,
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    events = asyncio.run(stream_completion(vllm_server.base_url, body))

    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["prompt_tokens"] == len(PROMPT_IDS)
    assert usage["completion_tokens"] == 8
    choices = [choice for event in events[:-2] for choice in event["choices"]]
    # Count tokens by id, not by chunk: a byte-level BPE token can decode to no text yet.
    assert sum(len(choice["token_ids"] or []) for choice in choices) == 8
    assert choices[-1]["finish_reason"] == "length"


@pytest.mark.vllm
def test_launch_vllm_replaces_the_default_server(vllm_server, launch_vllm) -> None:
    default_pid = vllm_server.pid
    with launch_vllm(["--max-model-len", "1024", "--max-num-seqs", "2"]) as custom:
        assert custom.pid != default_pid
        models = asyncio.run(get_json(f"{custom.base_url}/v1/models"))
        assert models["data"][0]["id"] == custom.model_name
        assert models["data"][0]["max_model_len"] == 1024
    assert not Path(f"/proc/{custom.pid}").exists()
    models = asyncio.run(get_json(f"{vllm_server.base_url}/v1/models"))
    assert models["data"][0]["max_model_len"] == 4096


@pytest.mark.parametrize(("require", "outcome"), [("0", "1 skipped"), ("1", "1 error")])
def test_missing_vllm_skips_unless_required(require: str, outcome: str, tmp_path: Path) -> None:
    env = {**os.environ, "SERVELAB_VLLM_PYTHON": str(tmp_path / "no-python"), "SERVELAB_REQUIRE_VLLM": require}
    env["SERVELAB_TINY_MODEL"] = str(tmp_path / "no-model")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{__file__}::test_streams_token_id_prompt_with_usage",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in done.stdout, done.stdout + done.stderr
