"""What the answer rests on that the user did not give, and how it moves across a plausible range.

A described deployment without an answer length is diagnosed at an assumed
one, and the ceiling depends on it strongly (each output token is an engine
step's worth of decode). Saying "ceiling 8.6 req/s" without saying it was
computed for 200-token answers presents a guess as a finding; so every
assumption is named, with the ceiling and the whole-answer latency at the
ends of its plausible range, on the simulator.
"""

from __future__ import annotations

from enum import StrEnum

from servelab.diagnose.capacity import saturation_rps
from servelab.diagnose.recommend import prefetch, run
from servelab.diagnose.regions import REGION_NOTE, Region
from servelab.diagnose.scenario import Scenario
from servelab.diagnose.text_tokens import CHARS_PER_TOKEN, CJK_RANGE, Script, ratio_said
from servelab.perf.vllm_versions import is_v0, v0_note
from servelab.schemas.diagnosis import Assumption, AssumptionPoint as Point
from servelab.targets.deployment import Deployment

ASSUMED_OUTPUT = 200
"""A chat answer's length when none is given: a few paragraphs."""
OUTPUT_RANGE = (50, 200, 500)
"""Short answers (classification, a sentence), a chat answer, a long one (code, a report)."""


class Assumed(StrEnum):
    OUTPUT = "output length"
    ARRIVALS = "arrivals"
    TOKENS = "tokens per character"


def assumptions(
    d: Deployment,
    s: Scenario,
    assumed: tuple[Assumed, ...],
    *,
    characters: tuple[int | None, Script | None] = (None, None),
    region: tuple[Region | None, bool] = (None, False),
) -> list[Assumption]:
    """Each assumption with how the ceiling and E2E p50 move across its range (output length: 50/200/500 tokens;
    characters per token: the script's range). Also said: an engine modelled approximately (vLLM V0), and the
    region whose chips the alternatives name when they name one (`region`: the one given, and whether any did)."""
    out: list[Assumption] = []
    if is_v0(d.vllm_version):
        out.append(Assumption(what="engine", assumed=v0_note(d.vllm_version) or "", points=[]))
    given_region, named_chips = region
    if named_chips:
        out.append(
            Assumption(
                what="where GPUs are bought",
                assumed=REGION_NOTE[given_region or Region.GLOBAL] + ("" if given_region else " (not given: --region)"),
                points=[],
            )
        )
    chars, script = characters
    if Assumed.TOKENS in assumed and chars is not None:
        out.append(
            Assumption(
                what=Assumed.TOKENS.value, assumed=ratio_said(chars, script), points=_token_points(d, s, chars, script)
            )
        )
    for what in assumed:
        if what is Assumed.OUTPUT:
            prefetch(((d, s.with_output_scale(tokens / s.mean_output), None) for tokens in OUTPUT_RANGE), ceilings=True)
            points = []
            for tokens in OUTPUT_RANGE:
                varied = s.with_output_scale(tokens / s.mean_output)
                points.append(
                    Point(
                        value=f"{tokens} tokens",
                        ceiling_rps=saturation_rps(d, varied),
                        median_e2el_ms=run(d, varied, None).value("median_e2el_ms"),
                    )
                )
            out.append(
                Assumption(
                    what=what.value, assumed=f"~{s.mean_output:.0f} tokens per answer (not given)", points=points
                )
            )
        elif what is Assumed.ARRIVALS:
            out.append(
                Assumption(
                    what=what.value,
                    assumed="Poisson at the given rate (independent users; bursts queue longer)",
                    points=[],
                )
            )
    return out


def _token_points(d: Deployment, s: Scenario, chars: int, script: Script | None) -> list[Point]:
    """The ceiling and E2E p50 at the other ratios the characters could stand for."""
    chosen = CHARS_PER_TOKEN[script or Script.LATIN]
    ratios = CJK_RANGE if script is Script.CJK else (CHARS_PER_TOKEN[Script.CJK],)
    points = []
    for ratio in ratios:
        varied = s.with_input_scale(chosen / ratio)
        points.append(
            Point(
                value=f"{chars / ratio:,.0f} tokens ({ratio:.1f} characters per token)",
                ceiling_rps=saturation_rps(d, varied),
                median_e2el_ms=run(d, varied, None).value("median_e2el_ms"),
            )
        )
    return points
