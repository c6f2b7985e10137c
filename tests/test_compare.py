"""`servelab compare` and `simulate --engine`: the same load on every engine, typed results that name the gap."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from typer.testing import CliRunner

from servelab.cli import app
from servelab.cli.schema import json_schema
from servelab.compare.compare import EngineComparison
from servelab.metrics.results import RUN

runner = CliRunner()
H100 = ["--gpu", "h100-sxm", "--model", "llama-3.1-8b"]
SMALL = ["--random-input-len", "600", "--random-output-len", "40", "--num-prompts", "30"]


def test_compare_json_is_the_typed_comparison(tmp_path: Path):
    out = tmp_path / "compare.json"
    result = runner.invoke(
        app,
        [
            "compare",
            *H100,
            *SMALL,
            "--sweep",
            "request-rate=2,inf",
            "--goodput",
            "ttft:2000",
            "--sglang-args",
            "--schedule-policy lpm --no-such-flag",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, json_schema("compare"))
    cmp = EngineComparison.model_validate(doc)
    assert [e.engine for e in cmp.engines] == ["vllm", "sglang", "trtllm"]
    assert sorted(cmp.ranking) == ["sglang", "trtllm", "vllm"]
    assert (cmp.mean_prompt_tokens, cmp.mean_output_tokens) == (600, 40)
    for engine in cmp.engines:
        assert [p.label for p in engine.points] == ["request-rate=2", "request-rate=inf"]
        assert all(p.completed == 30 and p.request_goodput is not None for p in engine.points)
        assert engine.memory.sequences_fit == min(engine.memory.kv_token_capacity // 640, engine.memory.max_running)
    sglang = cmp.engines[1]
    assert sglang.memory.block_size == 1 and sglang.settings["schedule_policy"] == "lpm"
    assert any("--no-such-flag" in w for w in sglang.warnings)
    trt = cmp.engines[2]
    assert trt.settings["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT" and trt.memory.block_size == 32
    assert cmp.explanations[0].startswith(cmp.engines[[e.engine for e in cmp.engines].index(cmp.ranking[0])].label)
    assert any(line.startswith("Memory plan:") and "KV tokens" in line for line in cmp.explanations)


def test_compare_refuses_an_unknown_engine_before_any_load():
    result = runner.invoke(app, ["compare", *H100, *SMALL, "--engines", "vllm,tgi"])
    assert result.exit_code == 2 and "tgi" in result.output


def test_simulate_engine_records_it_and_reports_flags_it_does_not_model(tmp_path: Path):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "simulate",
            *H100,
            *SMALL,
            "--request-rate",
            "4",
            "--engine",
            "trtllm",
            "--engine-args",
            "--max_batch_size 64 --enable_overlap_scheduler",
            "--result-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    info = json.loads((out / RUN).read_text())
    assert info["deployment"]["engine"] == "trtllm"
    assert info["deployment"]["engine_config"]["max_num_seqs"] == 64
    assert any("--enable_overlap_scheduler is obsolete" in w for w in info["deployment"]["warnings"])
