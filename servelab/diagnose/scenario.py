"""The workload a diagnosis replays on the simulator, and the runs it makes of it.

A measured run is replayed request by request (its prompt and output
lengths, its arrival times or its concurrency), so every what-if answers
"what would this change have done to *this* run". A described deployment
(no run) becomes a synthetic scenario with the stated lengths and load.
Token ids are synthetic and unique per request except for a shared prefix,
which is all the simulator's prefix cache needs to see.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from servelab.errors import InputError
from servelab.diagnose.evidence import arrival_of, workload_of
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.results import RunResult
from servelab.metrics.timeline import TimelineSample
from servelab.schemas.results import ArrivalInfo, PlanInfo, RunInfo
from servelab.targets.deployment import Deployment
from servelab.workload.lengths import LengthDistribution
from servelab.workload.spec import LoadPlan, RequestSpec

_ID_LOW, _ID_HIGH = 1000, 30000


@dataclass(frozen=True, slots=True)
class Shape:
    """One request's lengths and timing: all a replay keeps of it."""

    input_len: int
    output_len: int
    arrival: float
    prefix_group: int | None = None
    after: int | None = None
    """Index of the previous turn of the same conversation: this prompt resends that one's prompt and reply."""


@dataclass(frozen=True)
class Scenario:
    shapes: tuple[Shape, ...]
    max_concurrency: int | None
    """Closed loop when set and every arrival is 0."""
    prefix_len: int = 0
    seed: int = 0
    description: dict[str, object] = field(default_factory=dict)
    nominal_rate: float | None = None
    """The Poisson rate the arrivals were drawn at, when they were."""

    @property
    def mean_input(self) -> float:
        return float(np.mean([s.input_len for s in self.shapes]))

    @property
    def mean_output(self) -> float:
        return float(np.mean([s.output_len for s in self.shapes]))

    @property
    def mean_shared(self) -> float:
        """Mean prompt tokens a request shares with an earlier one: the shared prefix, or the history a turn resends."""

        def shared(s: Shape) -> int:
            if s.after is not None:
                previous = self.shapes[s.after]
                return min(s.input_len, previous.input_len + previous.output_len)
            return min(self.prefix_len, s.input_len) if s.prefix_group is not None else 0

        return float(np.mean([shared(s) for s in self.shapes]))

    @property
    def offered_rate(self) -> float | None:
        if self.nominal_rate is not None:
            return self.nominal_rate
        last = max(s.arrival for s in self.shapes)
        return (len(self.shapes) - 1) / last if last > 0 else None

    def specs(self) -> list[RequestSpec]:
        """The requests; a chat's (turns linked by `after`) open with the system prompt their first turn drew."""
        chat = any(s.after is not None for s in self.shapes)
        system = [0] * len(self.shapes)
        for i, s in enumerate(self.shapes):
            if s.after is not None:
                system[i] = system[s.after]
            elif chat and s.prefix_group is not None:
                system[i] = min(self.prefix_len, s.input_len)
        return [
            RequestSpec(
                index=i,
                prompt_ids=ids,
                max_tokens=s.output_len,
                arrival_time=s.arrival,
                prefix_group=s.prefix_group,
                prefix_len=shared,
                depends_on=s.after,
                system_len=system[i],
            )
            for i, (s, (ids, shared)) in enumerate(zip(self.shapes, _prompts(self.shapes, self.prefix_len, self.seed)))
        ]

    def plan(self) -> LoadPlan:
        return LoadPlan(requests=self.specs(), max_concurrency=self.max_concurrency)

    # -- variants (workload what-ifs) --------------------------------------

    def at_rate(self, rate: float) -> Scenario:
        """Same requests, Poisson arrivals at `rate` req/s (open loop, no concurrency cap)."""
        gaps = np.random.default_rng(self.seed + 1).exponential(1.0 / rate, size=len(self.shapes))
        times = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        return replace(
            self,
            shapes=tuple(replace(s, arrival=float(t)) for s, t in zip(self.shapes, times)),
            max_concurrency=None,
            nominal_rate=rate,
        )

    def closed_loop(self, concurrency: int) -> Scenario:
        return replace(
            self,
            shapes=tuple(replace(s, arrival=0.0) for s in self.shapes),
            max_concurrency=concurrency,
            nominal_rate=None,
        )

    def with_shared_prefix(self, prefix_len: int, groups: int = 1) -> Scenario:
        """The first `prefix_len` tokens of every prompt become one of `groups` shared prefixes."""
        shapes = tuple(replace(s, prefix_group=i % groups) for i, s in enumerate(self.shapes))
        return replace(self, shapes=shapes, prefix_len=prefix_len)

    def with_input_scale(self, factor: float) -> Scenario:
        shapes = tuple(replace(s, input_len=max(1, round(s.input_len * factor))) for s in self.shapes)
        return replace(self, shapes=shapes, prefix_len=round(self.prefix_len * factor))

    def with_output_scale(self, factor: float) -> Scenario:
        """Answers `factor` times as long; a chat's later turns resend the longer answers."""
        shapes: list[Shape] = []
        for s in self.shapes:
            out = max(1, round(s.output_len * factor))
            if s.after is None:
                shapes.append(replace(s, output_len=out))
                continue
            old, new = self.shapes[s.after], shapes[s.after]
            own = s.input_len - old.input_len - old.output_len  # this turn's own words
            shapes.append(replace(s, output_len=out, input_len=new.input_len + new.output_len + own))
        return replace(self, shapes=tuple(shapes))

    def repeated(self, times: int) -> Scenario:
        """The same requests `times` over (a chat's turns keep pointing at their own earlier turns): enough requests
        for a closed loop at a higher concurrency to reach its steady state."""
        n = len(self.shapes)
        shapes = tuple(
            replace(s, after=None if s.after is None else s.after + k * n) for k in range(times) for s in self.shapes
        )
        return replace(self, shapes=shapes)

    def with_max_input(self, max_len: int) -> Scenario:
        return replace(self, shapes=tuple(replace(s, input_len=min(s.input_len, max_len)) for s in self.shapes))


def synthetic(
    input_len: int,
    output_len: int,
    *,
    request_rate: float | None = None,
    max_concurrency: int | None = None,
    num_requests: int | None = None,
    prefix_len: int = 0,
    seed: int = 0,
    output_lengths: LengthDistribution | None = None,
    turns: int = 1,
) -> Scenario:
    """A described deployment's workload, Poisson at `request_rate` or closed loop.

    `input_len` is each request's new prompt tokens after a shared prefix of
    `prefix_len` (a system prompt); `output_lengths` draws each answer's
    length (EOS ends answers at varying lengths; default: exactly
    `output_len`). With `turns` > 1 requests are conversations whose turn k
    resends the prefix, every earlier prompt and every earlier reply, as a
    chat client does, and is sent when turn k-1's answer is complete.
    """
    if request_rate is None and max_concurrency is None:
        raise InputError("a described deployment needs --request-rate or --max-concurrency")
    if input_len < 1 or output_len < 1:
        raise InputError(
            f"a described deployment needs --input-len and --output-len >= 1, got {input_len} and {output_len}"
        )
    if turns < 1 or prefix_len < 0:
        raise InputError(f"--turns must be >= 1 and --prefix-len >= 0, got {turns} and {prefix_len}")
    if num_requests is None:
        num_requests = (
            int(np.clip((request_rate or 0) * 60, 300, 2000)) if request_rate else max(300, 8 * max_concurrency)
        )
    num_requests = max(turns, num_requests - num_requests % turns)
    lengths = output_lengths or LengthDistribution(output_len, "fixed")
    outs = lengths.sample(num_requests, np.random.default_rng(seed + 2))
    shapes: list[Shape] = []
    for i, out in enumerate(outs):
        turn = i % turns
        previous = shapes[-1] if turn else None
        resent = previous.input_len + previous.output_len if previous is not None else prefix_len
        shapes.append(Shape(resent + input_len, int(out), 0.0, 0 if prefix_len else None, i - 1 if turn else None))
    described: dict[str, object] = {
        "input_len": input_len,
        "output_len": lengths.describe(),
        "prefix_len": prefix_len,
        "turns": turns,
    }
    base = Scenario(tuple(shapes), None, prefix_len, seed, described)
    scenario = base.at_rate(request_rate) if request_rate else base.closed_loop(max_concurrency)
    if request_rate and max_concurrency:
        scenario = replace(scenario, max_concurrency=max_concurrency)
    return scenario


def from_run(run: RunResult, warmup: float = 0.0) -> Scenario:
    """Replay a measured run: each request's lengths, and its arrival time or the run's concurrency."""
    records = sorted((r for r in run.records if r.send_time >= warmup), key=lambda r: r.intended_time)
    if not records:
        raise InputError(f"{run.directory} has no records to diagnose")
    arrival, workload = arrival_of(run), workload_of(run)
    concurrency = arrival.max_concurrency
    rate = arrival.request_rate
    closed = rate in (None, "inf", float("inf"))
    t0 = records[0].intended_time
    system_prompts = workload.system_prompts if workload.system_prompt_len else 0
    chats = _chat_links(records, system_prompts) if workload.dataset_name == "multiturn" else None
    shapes = tuple(
        Shape(
            max(1, r.prompt_tokens),
            max(1, r.output_tokens),
            0.0 if closed else r.intended_time - t0,
            *(chats[i] if chats else (r.prefix_group, None)),
        )
        for i, r in enumerate(records)
    )
    prefix_len = workload.prefix_len or workload.system_prompt_len
    nominal = None if closed or rate is None else float(rate)
    return Scenario(shapes, concurrency, prefix_len, 0, {"replayed_from": str(run.directory)}, nominal)


def _chat_links(records: list[RequestRecord], system_prompts: int) -> list[tuple[int | None, int | None]]:
    """(prefix_group, after) of each record of a multiturn run, whose records carry their conversation in
    prefix_group: a turn resends the conversation's previous turn (`after`), and a first turn opens with one of the
    run's system prompts. Which one a conversation drew is not recorded: conversation c gets prompt c mod their
    count, so as many conversations share each prompt as in the run, on average."""
    last_turn: dict[int, int] = {}
    links: list[tuple[int | None, int | None]] = []
    for i, r in enumerate(records):
        conversation = r.prefix_group
        after = last_turn.get(conversation) if conversation is not None else None
        opens = after is None and conversation is not None and system_prompts > 0
        links.append(((conversation % system_prompts) if opens else None, after))
        if conversation is not None:
            last_turn[conversation] = i
    return links


def simulate(deployment: Deployment, scenario: Scenario, scrape_interval: float = 0.5) -> RunResult:
    """One in-memory simulated run: records and timeline, as a results directory would hold them."""
    sink = MemorySink()
    samples: list[TimelineSample] = []
    target = deployment.sim_target(scrape_interval=scrape_interval)
    outcome = target.run(scenario.plan(), sink, samples.append)
    arrival = ArrivalInfo(
        max_concurrency=scenario.max_concurrency,
        request_rate=scenario.offered_rate if scenario.max_concurrency is None else None,
    )
    info = RunInfo.begun(
        source="sim",
        deployment=deployment.describe(),
        workload=PlanInfo(arrival=arrival),
        engine_busy_s=outcome.client_stats.get("engine_busy_s"),
        api_server_busy_share=outcome.client_stats.get("api_server_busy_share"),
    )
    return RunResult(None, info, sink.records, samples)


@functools.lru_cache(maxsize=16)
def _prompts(shapes: tuple[Shape, ...], prefix_len: int, seed: int) -> tuple[tuple[np.ndarray, int], ...]:
    """Each request's prompt ids (read-only) and the tokens it shares with an earlier one.

    Drawing them took ~85 ms a simulation, and a diagnosis simulates the same
    requests again and again (each what-if of the engine keeps them).
    """
    rng = np.random.default_rng(seed)
    prefixes: dict[int, np.ndarray] = {}
    histories: dict[int, np.ndarray] = {}  # a turn's prompt and its reply: what the next turn resends
    out = []
    for i, s in enumerate(shapes):
        ids = rng.integers(_ID_LOW, _ID_HIGH, size=s.input_len, dtype=np.int32)
        shared = min(prefix_len, s.input_len) if s.prefix_group is not None else 0
        if shared:
            group = prefixes.setdefault(
                s.prefix_group, rng.integers(_ID_LOW, _ID_HIGH, size=prefix_len, dtype=np.int32)
            )
            ids[:shared] = group[:shared]
        if s.after is not None:
            history = histories[s.after]
            shared = min(len(history), s.input_len)
            ids[:shared] = history[:shared]
        histories[i] = np.concatenate([ids, rng.integers(_ID_LOW, _ID_HIGH, size=s.output_len, dtype=np.int32)])
        ids.flags.writeable = False
        out.append((ids, shared))
    return tuple(out)
