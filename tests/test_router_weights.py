"""llm-d's scorer weights: read from `--router-weights`, carried by the deployment to the router the simulation
builds, and the active-request scorer's two releases (at the response's end, or at its headers as llm-d's
benchmarked image did)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.errors import EXIT_BAD_INPUT
from servelab.flags.options import deployment_from_flags
from servelab.metrics.records import MemorySink
from servelab.sim import router as router_mod
from servelab.sim.router import DEFAULT_WEIGHTS, ActiveRelease, Router, RouterPolicy, ScorerWeights
from servelab.targets import sim as sim_target
from servelab.workload.spec import LoadPlan, RequestSpec

LOAD = ScorerWeights(prefix=0.0, queue=0.0, kv=1.0, active=1.0, active_until=ActiveRelease.HEADERS)


class _Replica:
    """A stand-in with the one attribute the router scrapes: (waiting, running, KV usage)."""

    def __init__(self, usage: float = 0.0) -> None:
        self.load = (0, 0, usage)


def test_the_flag_spelling_reads_back_what_it_says_and_leaves_out_scorers_at_zero():
    weights = ScorerWeights.parse("kv=1, active=1,active_until=headers")
    assert weights == LOAD
    assert ScorerWeights.parse(weights.flag()) == weights
    assert ScorerWeights.parse("prefix=2.5").active_until is ActiveRelease.END


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("prefix=2,queue", "'queue'"),
        ("prefix=2,latency=1", "'latency=1'"),
        ("prefix=two", "prefix='two'"),
        ("kv=-1", "kv='-1'"),
        ("kv=nan", "kv='nan'"),
        ("kv=1,kv=2", "kv is given twice"),
        ("prefix=0,kv=0", "every weight is 0"),
        ("kv=1,active_until=body", "active_until='body'"),
    ],
)
def test_bad_weights_are_refused_naming_the_bad_part(text, named):
    with pytest.raises(ValueError, match=named):
        ScorerWeights.parse(text)


def _simulate(tmp_path, *flags: str):
    argv = ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--replicas", "2", "--num-prompts", "4"]
    return CliRunner().invoke(app, [*argv, "--result-dir", str(tmp_path / "out"), *flags])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--router", "prefix-aware", "--router-weights", "prefix=2,kv=x"], "kv='x'"),
        (["--router", "round-robin", "--router-weights", "kv=1"], "not --router round-robin"),
        (["--router-weights", "kv=1"], "--router prefix-aware or --router prefix-estimate"),
    ],
)
def test_simulate_refuses_bad_weights_naming_the_flag_before_any_work(tmp_path, flags, named):
    result = _simulate(tmp_path, *flags)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    said = " ".join(result.output.split())
    assert "--router-weights" in said and named in said
    assert not (tmp_path / "out").exists()


def test_the_weights_given_reach_the_router_the_simulation_builds(monkeypatch):
    built: list[Router] = []

    class Recorded(Router):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(sim_target, "Router", Recorded)
    deployment = deployment_from_flags(
        "h100", "llama-3.1-8b", replicas=2, router="prefix-estimate", router_weights="prefix=1,queue=2,kv=3,active=4"
    )
    run = deployment.rebuilt(max_num_seqs=64).sim_target()  # a what-if keeps them too
    run.run(LoadPlan([RequestSpec(i, np.arange(300), 4) for i in range(3)]), MemorySink())
    assert [r.weights for r in built] == [ScorerWeights(1.0, 2.0, 3.0, 4.0)] * 2  # the check and the run
    assert built[1].outstanding == [0, 0]  # the run's router routed and heard every end


def test_a_router_with_no_weights_runs_its_own_and_one_that_weighs_no_scorer_refuses_them():
    assert Router("prefix-aware").weights == DEFAULT_WEIGHTS[RouterPolicy.PREFIX_AWARE]
    assert Router("prefix-estimate").weights.active_until is ActiveRelease.HEADERS  # as the benchmark's image ran
    with pytest.raises(ValueError, match="not least-outstanding"):
        Router("least-outstanding", weights=LOAD)


def test_an_active_scorer_released_at_the_headers_scores_every_replica_alike():
    """llm-d's benchmarked image forgot a streamed request at its headers: the pod with five in flight scores as the
    idle one, so the KV scorer alone decides; released at the response's end, the idle pod wins."""
    replicas = [_Replica(usage=0.1), _Replica(usage=0.3)]
    at_headers = Router("prefix-aware", weights=LOAD)
    at_end = Router("prefix-aware", weights=ScorerWeights(0.0, 0.0, 1.0, 1.0, ActiveRelease.END))
    for router in (at_headers, at_end):
        router.outstanding = [5, 0]
    assert at_headers.active_scores() == [1.0, 1.0]
    assert at_end.active_scores() == [0.0, 1.0]
    prompt = RequestSpec(0, np.arange(200), 4)
    assert at_headers.pick(replicas, prompt, 0.0) == 0  # 1 x 0.9 + 1 > 1 x 0.7 + 1
    assert at_end.pick(replicas, prompt, 0.0) == 1  # 0.9 + 0 < 0.7 + 1


def test_llm_d_load_profile_has_no_prefix_scorer_so_it_tokenizes_nothing():
    """With the prefix scorer weighted 0 the endpoint picker runs no prefix plugin: the scheduler's own time only,
    and no replica's cache is read."""
    prompt = RequestSpec(0, np.arange(9000), 4)
    assert Router("prefix-aware", weights=LOAD).own_time(prompt) == pytest.approx(router_mod.EPP_SCHEDULER_S)
    precise = Router("prefix-aware", weights=ScorerWeights.parse("prefix=2,kv=1,active=1"))
    assert precise.own_time(prompt) > router_mod.EPP_SCHEDULING_S  # it tokenizes the new prompt


def test_diagnosing_a_simulated_fleet_rebuilds_it_with_the_weights_it_ran(tmp_path):
    """run.json records --router-weights; `servelab diagnose RESULTS` and `servelab.diagnosis` (whose builder reads
    the catalogues) rebuild the same fleet from it."""
    from servelab.cli.diagnose import _deployment
    from servelab.diagnose.request import DeploymentWords, _simulated_deployment, from_catalogue
    from servelab.metrics.results import load_run

    text = "prefix=0,queue=0,kv=1,active=1,active_until=headers"
    assert _simulate(tmp_path, "--router", "prefix-aware", "--router-weights", text).exit_code == 0
    words = _simulated_deployment(load_run(tmp_path / "out"), DeploymentWords())
    assert words.router_weights == text
    assert _deployment(words).router_weights == ScorerWeights.parse(text)
    assert from_catalogue(words).router_weights == ScorerWeights.parse(text)
    assert CliRunner().invoke(app, ["diagnose", str(tmp_path / "out")]).exit_code == 0


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_another_engines_what_ifs_keep_the_weights(engine):
    """SGLang's and TensorRT-LLM's fleets are rebuilt from their launch lines: the router's weights go with them."""
    weights = "prefix=2,queue=0,kv=1,active=1"
    deployment = deployment_from_flags(
        "h100", "llama-3.1-8b", replicas=2, router="prefix-aware", router_weights=weights, engine=engine
    )
    expected = ScorerWeights.parse(weights)
    assert deployment.router_weights == expected
    assert deployment.rebuilt(max_num_seqs=64).router_weights == expected
    assert deployment.relaunched(deployment.engine_flags).router_weights == expected
