"""diagnose keeps the user's context: their vLLM release (V0 too), their script, their LoRA, their region, their link.

Everything here runs on the simulator. The numbers asserted are relations (more tokens, fewer blocks, a slower step,
no H100 offered in China), never a figure read off the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import servelab
from servelab.cli import app
from servelab.diagnose.analysis import Observed
from servelab.diagnose.levers import MERGE_LORA
from servelab.diagnose.regions import Region
from servelab.diagnose.request import Described, DeploymentWords, DiagnoseRequest, diagnose
from servelab.diagnose.text_tokens import Script, tokens_from_characters
from servelab.errors import InputError
from servelab.perf.cost_model import StepBatch
from servelab.perf.errors import PerfConfigError
from servelab.perf.vllm_versions import parse_version
from servelab.report.diagnosis_html import diagnosis_html
from servelab.targets.deployment import build_deployment

LATENCY = Observed(e2e_ms=8000.0)


def _described(words: DeploymentWords, described: Described, **kw) -> DiagnoseRequest:
    return DiagnoseRequest(words, described=described, observed=kw.pop("observed", LATENCY), **kw)


# --- the release: V0 modelled, flagged approximate ---------------------------------------------------------------


def test_a_0_6_deployment_runs_v0_defaults_and_v0s_cpu_gap_and_a_0_4_one_is_refused():
    v0 = build_deployment("a100-80gb", "qwen2.5-7b", vllm_version="0.6.3")
    v1 = build_deployment("a100-80gb", "qwen2.5-7b", vllm_version="0.8.0")
    c = v0.config
    assert not c.enable_prefix_caching and not c.enable_chunked_prefill and c.watermark == 0.01
    assert (c.max_num_seqs, c.max_num_batched_tokens) == (256, 32768)  # max(max_model_len, 2048) without chunking
    assert v1.config.enable_prefix_caching and v1.config.enable_chunked_prefill
    lone = StepBatch(decode_contexts=[1000])
    assert v0.step_cost().step_time(lone) > v1.step_cost().step_time(lone) + 2e-3  # the synchronous loop's gap
    assert any("V0 engine, modelled approximately" in w for w in v0.warnings)
    assert not any("V0" in w for w in v1.warnings)
    with pytest.raises(PerfConfigError, match="0.5"):
        parse_version("0.4.3")


@pytest.mark.slow
def test_a_v0_diagnosis_says_it_is_approximate_among_its_assumptions():
    dx = diagnose(
        _described(
            DeploymentWords("a100-80gb", "qwen2.5-7b", vllm_version="0.6.0"),
            Described(input_len=1000, output_len=200, request_rate=2.0),
        )
    )
    engine = [a for a in dx.assumptions if a.what == "engine"]
    assert engine and "modelled approximately" in engine[0].assumed
    assert dx.deployment.vllm_version == "0.6"


# --- characters into tokens, by script ---------------------------------------------------------------------------


@pytest.mark.slow
def test_cjk_characters_become_more_tokens_than_latin_ones_and_the_ratio_is_said():
    assert tokens_from_characters(1500, Script.CJK) == 1000 and tokens_from_characters(1500, None) == 375
    cjk = diagnose(
        _described(
            DeploymentWords("a100-80gb", "qwen2.5-7b"),
            Described(input_chars=1500, script=Script.CJK, output_len=200, request_rate=2.0),
        )
    )
    assert cjk.workload.mean_input_tokens == pytest.approx(1000, rel=0.02)
    said = next(a for a in cjk.assumptions if a.what == "tokens per character")
    assert "1.5 per token" in said.assumed and len(said.points) == 2  # the ceiling at the range's two ends
    assert said.points[0].ceiling_rps < said.points[1].ceiling_rps  # 1 char/token = more tokens = a lower ceiling
    with pytest.raises(InputError, match="--input-chars"):
        diagnose(
            _described(
                DeploymentWords("a100-80gb", "qwen2.5-7b"),
                Described(input_len=1500, input_chars=1500, output_len=200, request_rate=2.0),
            )
        )


# --- where GPUs can be bought -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def by_region():
    def run(region: Region | None):
        return diagnose(
            _described(
                DeploymentWords("a100-80gb", "qwen2.5-7b"),
                Described(input_len=1500, output_len=200, request_rate=4.0),
                region=region,
                price_options=True,
            )
        )

    return run(None), run(Region.CHINA)


@pytest.mark.slow
def test_china_is_offered_the_chips_sold_there_and_no_region_is_an_assumption(by_region):
    anywhere, china = by_region
    named = lambda dx: " ".join([lever.change for lever in dx.levers] + [a.change for a in dx.alternatives])  # noqa: E731
    assert "H100" in named(anywhere) and "H100" not in named(china)
    assert "H20" in named(china) and "H800" in named(china)
    said = {a.what: a.assumed for a in anywhere.assumptions}
    assert "not given: --region" in said["where GPUs are bought"]
    assert "export rules" in {a.what: a.assumed for a in china.assumptions}["where GPUs are bought"]


@pytest.mark.slow
def test_replica_and_tp_say_failover_and_the_link_they_run_over(by_region):
    anywhere, _ = by_region
    tp = next(a for a in anywhere.alternatives if a.change.startswith("+1 GPU: TP="))
    replica = next(a for a in anywhere.alternatives if a.change.endswith("replicas"))
    assert "NVLink 600 GB/s" in tp.why and "no failover" in tp.why and "failover" in replica.why
    pcie = diagnose(
        _described(
            DeploymentWords("a100-pcie", "qwen2.5-7b"), Described(input_len=1500, output_len=200, request_rate=4.0)
        )
    )
    lever = next(lv for lv in pcie.levers if "tensor parallelism" in lv.change)
    assert "PCIe 64 GB/s" in lever.change


# --- an unmerged LoRA -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_enable_lora_takes_kv_memory_slows_each_step_and_merging_is_a_lever():
    base = build_deployment("a100-80gb", "qwen2.5-7b")
    lora = build_deployment("a100-80gb", "qwen2.5-7b", "--enable-lora --max-loras 4 --max-lora-rank 64")
    assert lora.memory.num_blocks < base.memory.num_blocks
    batch = StepBatch(decode_contexts=[1000] * 32)
    assert lora.step_cost().step_time(batch) > base.step_cost().step_time(batch)
    assert lora.engine_args() == "--enable-lora --max-loras 4 --max-lora-rank 64"
    dx = diagnose(
        _described(
            DeploymentWords("a100-80gb", "qwen2.5-7b", "--enable-lora"),
            Described(input_len=1000, output_len=200, request_rate=3.0),
        )
    )
    merge = next(lv for lv in dx.levers if lv.change == MERGE_LORA)
    assert merge.after < merge.before  # E2E p50, latency question


# --- the library face takes what the CLI takes ------------------------------------------------------------------


def test_the_api_takes_tried_changes_and_a_goal_and_refuses_a_bad_one_first(tmp_path: Path):
    run = servelab.simulate(
        "a100-80gb",
        "qwen2.5-7b",
        input_len=512,
        output_len=64,
        request_rate=6,
        num_prompts=60,
        result_dir=tmp_path / "run",
    )
    with pytest.raises(InputError, match="not one of no-effect"):
        servelab.diagnosis(run, "a100-80gb", "qwen2.5-7b", tried=["awq:maybe"])
    dx = servelab.diagnosis(run, "a100-80gb", "qwen2.5-7b", tried=["--kv-cache-dtype fp8:no-effect"], goal="latency")
    assert dx.goal == "latency" and dx.levers[0].change.startswith("stream the answer")
    fp8 = next(lv for lv in dx.levers if "FP8 KV cache" in lv.change)
    assert fp8.tried == "no-effect"
    cli = CliRunner().invoke(
        app,
        [
            "diagnose",
            str(tmp_path / "run"),
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--tried",
            "--kv-cache-dtype fp8:no-effect",
            "--goal",
            "latency",
            "--json",
        ],
    )
    assert cli.exit_code == 0, cli.output
    assert [lv["change"] for lv in json.loads(cli.stdout)["levers"]] == [lv.change for lv in dx.levers]  # one verb


@pytest.mark.slow
def test_the_html_report_shows_the_questions_levers(by_region):
    anywhere, _ = by_region
    page = diagnosis_html("run", anywhere)
    assert anywhere.levers and "Your question is" in page
    for lever in anywhere.levers:
        assert lever.change.split(" (")[0] in page
    assert page.index("Your question is") < page.index('class="finding')
