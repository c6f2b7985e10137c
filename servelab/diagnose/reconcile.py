"""What the user saw against what the described deployment gives on the simulator, both ways, solved backwards.

"10 s answers" on a deployment the simulator serves in 2.7 s is the main clue
of a diagnosis, not a footnote: either more runs than was described (more
streams at once, longer answers), or the time goes somewhere the engine
never sees (retrieval before the call, the application, a gateway's queue).
Each explanation is made concrete by solving the inverse on the simulator:
the concurrency (or rate), the answer length, the prompt length or the
prefix-cache share that reproduces the observed figure, found by bisection
over simulated runs of the same workload. Explanations are ranked by how far
they stray from the description (the nearer, the likelier) and by what the
user already tried (diagnose/tried.py): a change the user saw do nothing is
evidence against an explanation under which the simulator says it helps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from servelab.targets.engine_terms import Terms
from servelab.diagnose.findings import make_finding
from servelab.schemas.diagnosis import Finding
from servelab.schemas.vocabulary import FindingKind
from servelab.diagnose.parallel import parallel_map
from servelab.diagnose.recommend import Outcome, run
from servelab.diagnose.scenario import Scenario
from servelab.metrics import timeline as tl
from servelab.diagnose.tried import Tried, TriedResult, predicted
from servelab.perf.errors import PerfConfigError
from servelab.targets.deployment import Deployment

OBSERVED_VS_SIMULATED = FindingKind.OBSERVED_VS_SIMULATED

FAR = 1.5
"""Observed/simulated ratio (either way) that is a finding: well beyond the simulator's 5-15% error on real GPUs and
the roughness of a figure read off a dashboard."""
UTIL_GAP = 0.2
"""Busy-share gap (absolute) that is a finding: nvidia-smi samples ~1/6 s windows and users read it by eye."""
BISECTION_STEPS = 7
"""Halvings of the log-range: 1/8x-8x to within ~3%, the simulator's own noise."""
SPAN = 8.0
"""How far from the description the inverse looks, each way."""
LOAD_SPAN = 256.0
"""How far below the described load the inverse looks: a GPU decodes whenever one answer is being written, so its busy
share falls only when the server is idle most of the time."""


class Figure(StrEnum):
    E2E = "E2E"
    TTFT = "TTFT"
    TPOT = "TPOT"
    QPS = "QPS"
    UTIL = "GPU utilisation"


SUMMARY_KEY = {
    Figure.E2E: "median_e2el_ms",
    Figure.TTFT: "median_ttft_ms",
    Figure.TPOT: "median_tpot_ms",
    Figure.QPS: "request_throughput",
}


def measure(o: Outcome, figure: Figure) -> float | None:
    """The simulated counterpart of an observed figure: medians for latencies (what a dashboard's "typical" is)."""
    if figure is Figure.UTIL:
        return o.engine_busy
    value = o.summary.get(SUMMARY_KEY[figure])
    return float(value) if isinstance(value, (int, float)) else None


def fmt(figure: Figure, value: float) -> str:
    if figure is Figure.UTIL:
        return f"{value:.0%}"
    if figure is Figure.QPS:
        return f"{value:.2f} req/s"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"


@dataclass(frozen=True)
class Gap:
    figure: Figure
    observed: float
    simulated: float

    @property
    def above(self) -> bool:
        return self.observed > self.simulated

    @property
    def far(self) -> bool:
        if self.figure is Figure.UTIL:
            return abs(self.observed - self.simulated) >= UTIL_GAP
        return self.simulated > 0 and max(self.observed / self.simulated, self.simulated / self.observed) >= FAR

    def text(self) -> str:
        how = (
            (f"{self.observed / self.simulated:.1f}x" if self.above else f"{self.simulated / self.observed:.1f}x below")
            if self.figure is not Figure.UTIL
            else f"{100 * (self.observed - self.simulated):+.0f} points"
        )
        return (
            f"you see {self.figure} {fmt(self.figure, self.observed)}; the deployment as described gives "
            f"{fmt(self.figure, self.simulated)} on the simulator ({how})"
        )


@dataclass(frozen=True)
class Knob:
    """One thing the description may have wrong, as a factor on what was described."""

    name: str
    vary: Callable[[float], Scenario]
    says: Callable[[float, Outcome], str]
    """What the solved value means, in the user's terms."""
    decides: str
    """The measurement that confirms or rules it out."""
    upper: float = SPAN
    lower: float = 1 / SPAN
    missed: str = ""
    """What was looked at, when no value in the range reproduces the figure."""


@dataclass
class Explanation:
    knob: str
    text: str
    decides: str
    score: float
    scenario: Scenario | None
    """The scenario that reproduces the figure (None: time outside the engine, which the scenario does not hold)."""
    outside_ms: float = 0.0
    checks: list[str] | None = None
    """What was tried and the other figures reported, each under this explanation, with how well it fits."""

    def label(self, above: bool) -> str:
        """The explanation in a few words, for a title."""
        more = "more" if above else "less"
        return {
            "load": f"{more} load than described",
            "answers": f"{'longer' if above else 'shorter'} answers than described",
            "prompts": f"{'longer' if above else 'shorter'} prompts than described",
            "prefix cache": "prompt tokens served from the prefix cache",
            "outside": "time spent outside the engine",
            "averaged": "a figure averaged over quiet time",
        }[self.knob]


def solve(d: Deployment, knob: Knob, figure: Figure, target: float) -> tuple[float, Outcome] | None:
    """The knob's value (as a factor of the described one) whose simulated figure is `target`, by bisection in log
    space over [knob.lower, knob.upper]; None when no value there reaches it (the figure is monotone in each knob)."""

    def at(factor: float) -> float:
        value = measure(run(d, knob.vary(factor), None), figure)
        return value if value is not None else math.nan

    lo, hi = math.log(knob.lower), math.log(knob.upper)
    f_lo, f_hi = at(math.exp(lo)), at(math.exp(hi))
    if math.isnan(f_lo) or math.isnan(f_hi) or not min(f_lo, f_hi) <= target <= max(f_lo, f_hi):
        return None
    rising = f_hi >= f_lo
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if (at(math.exp(mid)) < target) == rising:
            lo = mid
        else:
            hi = mid
    factor = math.exp((lo + hi) / 2)
    return factor, run(d, knob.vary(factor), None)


def knobs(d: Deployment, s: Scenario, figure: Figure, saturation: float | None = None) -> list[Knob]:
    """What could be other than described, for this figure: the load, the answers, the prompts, the prefix cache.
    An open loop's rate goes to 1.2x the `saturation` rate at most: above it the queue, not the rate, sets the
    figure."""
    t = Terms(d.engine)
    out: list[Knob] = []
    if s.max_concurrency is not None and not s.offered_rate:
        out.append(_closed_load(d, s, s.max_concurrency, t))
    elif s.offered_rate:
        out.append(_open_load(s, s.offered_rate, saturation, t))
    out.append(_answers(s, t))
    if figure in (Figure.TTFT, Figure.UTIL):
        out.append(_prompts(d, s))
        if s.prefix_len == 0:
            out.append(_prefix_cache(s, t))
    return out


def _closed_load(d: Deployment, s: Scenario, c: int, t: Terms) -> Knob:
    """More or fewer requests in flight than the `c` described: a closed loop's load is its concurrency."""

    def closed(f: float) -> Scenario:
        n = max(1, round(c * f))
        times = max(1, math.ceil(4 * n / len(s.shapes)))
        return (s.repeated(times) if times > 1 else s).closed_loop(n)

    # Up to four times what the engine can run at once: beyond it requests queue, and waiting adds to every figure.
    most = 4 * (d.config.max_num_seqs or 256) * d.config.data_parallel_size
    return Knob(
        "load",
        closed,
        lambda f, o: (
            f"~{_value_c(c, f)} requests in flight at once (you described {c}), "
            f"~{_count(o.mean_running)} of them decoding in each step"
        ),
        f"the engine's own gauges at peak ({t.metrics(tl.RUNNING, tl.WAITING)} on /metrics)",
        upper=max(SPAN, most / c),
        lower=1 / LOAD_SPAN,
        missed=f"{max(1, round(c / LOAD_SPAN))}-{round(c * max(SPAN, most / c))} requests in flight",
    )


def _open_load(s: Scenario, r: float, saturation: float | None, t: Terms) -> Knob:
    """A higher or lower arrival rate than the `r` described, up to 1.2x the saturation rate."""
    return Knob(
        "load",
        lambda f: s.at_rate(r * f),
        lambda f, o: (
            f"~{r * f:.2f} req/s arriving (you described {r:.2f}), ~{_count(o.mean_running)} decoding in each step"
        ),
        f"the request counter's rate at peak ({t.token_counters} on /metrics)",
        upper=max(1.0, 1.2 * (saturation or r) / r),
        lower=1 / LOAD_SPAN,
        missed=f"{r / LOAD_SPAN:.2f}-{max(r, 1.2 * (saturation or r)):.2f} req/s",
    )


def _answers(s: Scenario, t: Terms) -> Knob:
    """Longer or shorter answers than described: every figure grows with the tokens decoded."""
    return Knob(
        "answers",
        s.with_output_scale,
        lambda f, o: f"answers of ~{s.mean_output * f:.0f} tokens (you described ~{s.mean_output:.0f})",
        f"the mean answer length the server counts ({t.metrics(tl.GENERATION_TOKENS, tl.E2E_COUNT)} on "
        "/metrics: output tokens per finished request), or the usage field of a sample of responses",
        missed=f"answers of {s.mean_output / SPAN:.0f}-{s.mean_output * SPAN:.0f} tokens",
    )


def _prompts(d: Deployment, s: Scenario) -> Knob:
    """Longer or shorter prompts than described (lengths given in characters or words are not tokens)."""
    return Knob(
        "prompts",
        s.with_input_scale,
        lambda f, o: (
            f"prompts of ~{s.mean_input * f:.0f} tokens (you described {s.mean_input:.0f}: "
            "lengths counted in characters or words are not tokens)"
        ),
        "the prompt-token counter's rate over the request counter's, or the usage field of a few responses",
        upper=min(SPAN, (d.config.max_model_len or 32768) / max(1.0, s.mean_input + s.mean_output)),
        missed=f"prompts of {s.mean_input / SPAN:.0f}-{s.mean_input * SPAN:.0f} tokens",
    )


def _prefix_cache(s: Scenario, t: Terms) -> Knob:
    """A share of each prompt served from the prefix cache, where the description named no shared prefix."""
    return Knob(
        "prefix cache",
        lambda f: s.with_shared_prefix(int(min(0.95, f) * s.mean_input)),
        lambda f, o: (
            f"~{min(0.95, f):.0%} of each prompt served from the prefix cache (a system "
            "prompt, resent history or retrieved passages that repeat): those tokens are "
            "not computed"
        ),
        f"the prefix-cache hit rate ({t.metrics(tl.PREFIX_HITS, tl.PREFIX_QUERIES)} on /metrics)",
        upper=1.0,
        missed="up to 95% of each prompt from the prefix cache",
    )


def _count(x: float | None) -> str:
    return f"{x or 0:.0f}" if (x or 0) >= 10 else f"{x or 0:.1f}"


def _value_c(c: int, f: float) -> int:
    return max(1, round(c * f))


OUTSIDE_DECIDES = (
    "the server's own end-to-end latency (the e2e request latency histogram's sum over its count on "
    "/metrics) beside what the application measures: if the server's is the simulated figure, the rest "
    "is spent before or after the engine (retrieval, the application, a gateway's queue)"
)


def explain(
    d: Deployment,
    s: Scenario,
    gap: Gap,
    tried: Sequence[Tried] = (),
    saturation: float | None = None,
    others: dict[Figure, float] | None = None,
) -> tuple[list[Explanation], list[str]]:
    """Every explanation of `gap` the simulator can make concrete, best first; and what was simulated and does not
    reproduce the figure (said too: "no prompt length gives 30%" is evidence)."""
    out: list[Explanation] = []
    missed: list[str] = []
    tried_knobs = knobs(d, s, gap.figure, saturation)
    solutions = parallel_map(lambda knob: solve(d, knob, gap.figure, gap.observed), tried_knobs)
    for knob, solved in zip(tried_knobs, solutions):
        if solved is None:
            missed.append(knob.missed)
            continue
        factor, outcome = solved
        # The nearer the description, the likelier: 2x off scores 0.59, 4x 0.42, 8x 0.32. A prefix-cache share is
        # not a departure from a described length: it scores as a 2x one.
        departure = 2.0 if knob.name == "prefix cache" else factor
        out.append(
            Explanation(
                knob.name,
                knob.says(factor, outcome),
                knob.decides,
                1 / (1 + abs(math.log(departure))),
                knob.vary(factor),
            )
        )
    if gap.above and gap.figure in (Figure.E2E, Figure.TTFT):
        outside = gap.observed - gap.simulated
        out.append(
            Explanation(
                "outside",
                f"~{outside:,.0f} ms of each request spent outside the engine: retrieval (RAG) or the "
                "application before the call, a gateway or load balancer queueing requests, or a client that "
                "reads the stream slowly",
                OUTSIDE_DECIDES,
                0.45,
                None,
                outside,
            )
        )
    if not gap.above and gap.figure in (Figure.UTIL, Figure.QPS):
        out.append(
            Explanation(
                "averaged",
                f"a {gap.figure} averaged over quiet hours or over several GPUs, or sampled off-peak",
                "the figure read at the peak minute, per GPU (`nvidia-smi dmon -s u -d 1` beside the request rate)",
                0.35,
                None,
            )
        )
    for e in out:
        weigh(d, s, e, gap, tried)
        cross_check(d, s, e, others or {})
    return sorted(out, key=lambda e: e.score, reverse=True), missed


NOISE = 0.1
"""Spread of a user's "no effect" (relative change of the figure): what the eye does not see on a dashboard, and the
simulator's own error; a predicted change of one NOISE is still "no effect" with likelihood 0.61, of three 0.01."""
FLOOR = 0.02
"""The least likelihood of any report: users misremember, and the change tried may not be the one modelled."""


def likelihood(reported: TriedResult, change: float) -> float:
    """How likely the user reports `reported` when the figure moved by `change` (relative; lower is better)."""
    unseen = math.exp(-0.5 * (change / NOISE) ** 2)
    seen = {
        TriedResult.NO_EFFECT: unseen,
        TriedResult.HELPED: (1 - unseen) if change < 0 else 0.0,
        TriedResult.HURT: (1 - unseen) if change > 0 else 0.0,
    }[reported]
    return max(FLOOR, seen)


def weigh(d: Deployment, base: Scenario, e: Explanation, gap: Gap, tried: Sequence[Tried]) -> None:
    """Each tried change simulated under this explanation: the explanation's score is multiplied by the likelihood of
    what the user saw given what the simulator predicts there. Time outside the engine dilutes an engine change's
    effect by the time it does not touch."""
    if not tried or gap.figure not in (Figure.E2E, Figure.TTFT, Figure.TPOT):
        return
    e.checks = []
    for t in tried:
        try:
            before, after = predicted(d, t, e.scenario or base, lambda o: measure(o, gap.figure), e.outside_ms)
        except PerfConfigError:
            continue
        fit = likelihood(t.result, (after - before) / before if before else 0.0)
        e.score *= fit
        e.checks.append(
            f"{t.change} would have moved {gap.figure} {moved(gap.figure, before, after)}; you saw "
            f"{t.result}: {agreement(fit)}"
        )


def moved(figure: Figure, before: float, after: float) -> str:
    change = f" ({(after - before) / before:+.0%})" if before else ""
    return f"{fmt(figure, before)} → {fmt(figure, after)}{change}"


SPREAD = 0.3
"""Log-spread of a second reported figure around what an explanation predicts for it: 1.35x off is still a fit
(likelihood 0.61), 2x off is not (0.07)."""


def cross_check(d: Deployment, base: Scenario, e: Explanation, others: dict[Figure, float]) -> None:
    """The user's other figures under this explanation: time outside the engine adds to E2E and TTFT but leaves TPOT
    as described; more load or longer answers move them all. Each one's likelihood multiplies the score."""
    outcome = run(d, e.scenario or base, None)
    lines = e.checks if e.checks is not None else []
    for figure, seen in others.items():
        if figure not in (Figure.E2E, Figure.TTFT, Figure.TPOT):
            continue
        predicted = (measure(outcome, figure) or 0.0) + (e.outside_ms if figure is not Figure.TPOT else 0.0)
        if predicted <= 0:
            continue
        fit = max(FLOOR, math.exp(-0.5 * (math.log(seen / predicted) / SPREAD) ** 2))
        e.score *= fit
        lines.append(f"your {figure} {fmt(figure, seen)}; under this, {fmt(figure, predicted)}: {agreement(fit)}")
    e.checks = lines or None


def agreement(fit: float) -> str:
    return "agrees" if fit >= 0.5 else "contradicts" if fit < 0.2 else "fits loosely"


@dataclass(frozen=True)
class Reconciled:
    finding: Finding
    scenario: Scenario | None
    """The workload of the likeliest explanation, when it is one the simulator reproduces (not time outside)."""
    label: str
    """That explanation in a few words."""


def finding(
    d: Deployment,
    s: Scenario,
    baseline: Outcome,
    observed: dict[Figure, float],
    tried: Sequence[Tried] = (),
    saturation: float | None = None,
) -> Reconciled | None:
    """The first finding when what the user saw is far from what the described deployment gives, with its ranked
    explanations; None when every figure is near its simulated counterpart."""
    gaps = [
        Gap(f, v, sim)
        for f, v in observed.items()
        if (sim := measure(baseline, f)) is not None and sim > 0 and Gap(f, v, sim).far
    ]
    if not gaps:
        return None
    gap = gaps[0]  # the first figure the user gave, in Figure's order: latency before throughput before utilisation
    evidence = [g.text() for g in gaps]
    ranked, missed = explain(d, s, gap, tried, saturation, {f: v for f, v in observed.items() if f is not gap.figure})
    for i, e in enumerate(ranked, 1):
        evidence.append(f"{i}. {e.text} — decided by {e.decides}")
        evidence.extend(f"   {line}" for line in e.checks or [])
    if missed:
        evidence.append(
            f"simulated and not reproducing {gap.figure} {fmt(gap.figure, gap.observed)}: " + "; ".join(missed)
        )
    word = "above" if gap.above else "below"
    title = (
        f"You see {gap.figure} {fmt(gap.figure, gap.observed)}, {word} the simulated "
        f"{fmt(gap.figure, gap.simulated)}: "
        + (f"most likely {ranked[0].label(gap.above)}" if ranked else "unexplained")
    )
    best = ranked[0] if ranked else None
    return Reconciled(
        make_finding(OBSERVED_VS_SIMULATED, title, 1.0, evidence),
        best.scenario if best else None,
        best.text.split(" (")[0] if best else "",
    )


TRIED = FindingKind.TRIED


def tried_finding(d: Deployment, s: Scenario, tried: Sequence[Tried], figure: Figure = Figure.E2E) -> Finding | None:
    """What each tried change does at the described load on the simulator, against what the user saw; ranked first
    when one contradicts it (the description, or the engine as the place the time goes, is then in doubt)."""
    if not tried:
        return None
    lines, worst = [], 1.0
    for t in tried:
        before, after = predicted(d, t, s, lambda o: measure(o, figure))
        fit = likelihood(t.result, (after - before) / before if before else 0.0)
        worst = min(worst, fit)
        lines.append(
            f"{t.change}: on the simulator {figure} {moved(figure, before, after)}; you saw {t.result}: "
            f"{agreement(fit)}"
        )
    if worst < 0.2:
        lines.append(
            "a change that should have moved the figure did not: the engine is not where the time goes (it "
            "is spent outside: retrieval, the application, a gateway), or more runs at once than described "
            "(a step at a larger batch is compute-bound, and smaller weights then gain less)"
        )
    title = (
        "What you tried contradicts the simulation of the deployment as described"
        if worst < 0.2
        else "What you tried agrees with the simulation"
    )
    return make_finding(TRIED, title, 0.95 if worst < 0.2 else 0.2, lines)
