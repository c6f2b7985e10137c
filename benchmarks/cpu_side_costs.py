"""Measure vLLM's CPU-side costs (API server and engine core) on the vLLM CPU build with the tiny model.

The API server (HTTP, tokenization, detokenization, SSE) and the engine core's
per-step Python (schedule, input preparation, output bookkeeping, output
update) are the same code on a GPU server as on the CPU build. With a tiny
model the arithmetic is negligible, so what is timed is that Python:

1. Engine core, in process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, uniprocess
   executor, so the model runner is in this process too): every step's
   `Scheduler.schedule`, `execute_model` minus the model's forward,
   `sample_tokens` minus the sampler, and `Scheduler.update_from_output`,
   timed by wrappers in thread CPU time (so other jobs on the host do not
   count); and the API-side `OutputProcessor.process_outputs`
   (detokenize, build outputs) per step. Batches of B = 1..256 requests of
   16 tokens; fitted per step: fixed + per scheduled request, plus the extra
   of a step that admits new requests (fixed + per admitted request).
2. API server, as served (`python -m vllm.entrypoints.openai.api_server`,
   float32 so the CPU build's model is fast enough to load the API server),
   its process pinned to core 0 and the engine core, the model's worker and
   the load generator (aiohttp, one session, as `vllm bench serve`) to core 1.
   The serial part of the API server is its event-loop thread; its CPU time
   (/proc/PID/task/TID/schedstat) per request over saturating loads of 128
   streams (and two of 8, which separate the per-engine-step cost) is fitted
   as per request + per prompt token + per output token + per SSE chunk (which
   merge under load) + per engine step; the other threads (the tokenizer pool,
   ZMQ I/O) run beside it and are fitted apart. Also: every thread's idle CPU
   (busy-polling threads), and at concurrency 1 the client's TTFT split by
   vLLM's own per-request histograms (queue, prefill, TTFT from arrival).
3. The host's single-core speed: the best of 5 runs of a fixed pure-Python
   reference loop, so a GPU server's costs are these x (its loop time / ours).

Every server or engine run holds `flock /tmp/servelab-heavy.lock`; every load
loop is bounded in count and in time; only the processes started here are
stopped, by their process group.

    .venv/bin/python benchmarks/cpu_side_costs.py [--raw raw.json] [--out servelab/perf/data/vllm_cpu_costs.yaml]
    .venv/bin/python benchmarks/cpu_side_costs.py --api-only --raw api.json   # part 2 only, the rest kept
    .venv/bin/python benchmarks/cpu_side_costs.py --from-raw api.json         # refit only
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from collections.abc import Sequence
from pathlib import Path
from typing import Self

LOCK = "/tmp/servelab-heavy.lock"
CACHE = Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))
ENGINE_BATCHES = (1, 4, 16, 64, 256)
ENGINE_PROMPT, ENGINE_OUTPUT = 16, 32
API_SCENARIOS = ((16, 1), (128, 1), (512, 1), (16, 64), (16, 256))
"""(prompt words, output tokens) per API-server scenario; a word is ~6 tokens of the tiny model's tokenizer."""
API_CONCURRENCY = 8
GPU_HOST = {
    "speed_factor": 1.0,
    "why": (
        "CPU seconds on a GPU server's host core per CPU second on this host (family 25 model 1: a Zen 3 "
        "Milan core at 2.45 GHz, cloud EPYC 7B13 class). GPU servers' host cores bracket it: AWS p5 (H100) "
        "has the same Zen 3 Milan family, DGX H100 and Azure/GCP H100 machines Sapphire Rapids "
        "(Golden Cove, ~10-25% faster single-thread than Zen 3 in published SPECint/Geekbench single-core "
        "results), DGX A100 Zen 2 Rome (~15-20% slower per clock). With no measurement on those hosts, 1.0 "
        "is the unbiased middle, with about +-25% uncertainty; a calibration profile of the real server replaces "
        "these costs by fitted ones, and Deployment.build(cpu_speed_factor=...) sets another factor."
    ),
}


def reference_loop_s(repeats: int = 5) -> float:
    """Best-of-`repeats` CPU time of a fixed pure-Python loop: the host's single-core speed for interpreter work.

    Thread CPU time, not wall time, so that waiting for a core on a shared host does not count.
    """
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        d: dict[int, int] = {}
        acc = 0
        for i in range(2_000_000):
            d[i & 1023] = acc
            acc = (acc + i * 7) % 1_000_003
        best = min(best, time.thread_time() - t0)
    return best


@contextmanager
def heavy_lock():
    """The shared lock every real-server run on this machine takes (same flock(2) as `flock(1)`)."""
    with open(LOCK, "a") as fh:
        print(f"waiting for {LOCK} ...", file=sys.stderr, flush=True)
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def linear_fit(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares (numpy; called in servelab's venv only, the workers run in vLLM's)."""
    import numpy as np

    coef, *_ = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys, dtype=float), rcond=None)
    return [float(c) for c in coef]


# -- 1. engine core, in process (runs under the vLLM venv's python) -----------------------------------------


def time_method(timers: dict[str, float], cls: type, name: str, key: str, before=None, after=None) -> None:
    """Wrap cls.name so each call adds its CPU time to timers[key]; `before(self)` and `after(result)` see each call.

    CPU time of this thread: the engine core's Python runs on one thread, and a shared host's other jobs must not
    count (torch's kernels in its worker threads are not this thread's time either)."""
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        if before is not None:
            before(self)
        t0 = time.thread_time()
        out = original(self, *args, **kwargs)
        timers[key] = timers.get(key, 0.0) + time.thread_time() - t0
        if after is not None:
            after(out)
        return out

    setattr(cls, name, wrapper)


def engine_worker(model_dir: str, deadline_s: float) -> None:
    """Time every engine-core step's CPU work; prints one JSON object of per-step records."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    timers: dict[str, float] = {}

    batch: dict[str, int] = {}

    def record_batch(out) -> None:
        batch["scheduled"] = len(out.num_scheduled_tokens)
        batch["new"] = len(out.scheduled_new_reqs)
        batch["tokens"] = out.total_num_scheduled_tokens
        batch["finished"] = len(out.finished_req_ids)

    time_method(timers, Scheduler, "schedule", "schedule", after=record_batch)
    time_method(timers, Scheduler, "update_from_output", "update")
    time_method(timers, GPUModelRunner, "execute_model", "execute")
    time_method(timers, GPUModelRunner, "_model_forward", "forward")
    time_method(timers, GPUModelRunner, "sample_tokens", "sample_tokens")
    time_method(timers, GPUModelRunner, "_sample", "sampler")
    time_method(timers, OutputProcessor, "process_outputs", "api_outputs")

    llm = LLM(
        model=model_dir,
        max_model_len=4096,
        max_num_seqs=max(ENGINE_BATCHES),
        max_num_batched_tokens=8192,
        distributed_executor_backend="uni",
        enable_prefix_caching=False,
        seed=0,
    )
    engine = llm.llm_engine
    config = engine.vllm_config.scheduler_config
    vocab = engine.model_config.get_vocab_size()
    rng = random.Random(0)
    params = SamplingParams(max_tokens=ENGINE_OUTPUT, ignore_eos=True, temperature=0)
    records: list[dict[str, float]] = []
    start = time.monotonic()
    for repeat in range(3):
        for b in ENGINE_BATCHES:
            for i in range(b):
                prompt = TokensPrompt(prompt_token_ids=[rng.randrange(10, vocab - 10) for _ in range(ENGINE_PROMPT)])
                engine.add_request(f"r{repeat}-{b}-{i}", prompt, params)
            for _ in range(10 * ENGINE_OUTPUT + 50):  # bounded: the batch needs ENGINE_OUTPUT + 2 steps
                if not engine.has_unfinished_requests() or time.monotonic() - start > deadline_s:
                    break
                timers.clear()
                batch.clear()
                engine.step()
                if batch:
                    records.append({"batch": b, "repeat": repeat, **batch, **timers})
    tokenizer = llm.get_tokenizer()
    text = " ".join(f"w{rng.randrange(100000)}" for _ in range(4000))
    tokenize = []
    for n_chars in (100, 1000, 4000, 16000):
        piece = text[:n_chars]
        n_tokens = len(tokenizer.encode(piece))
        best = min(_timed_call(tokenizer.encode, piece) for _ in range(20))
        tokenize.append({"tokens": n_tokens, "seconds": best})
    print(
        json.dumps(
            {
                "vllm_version": _vllm_version(),
                "async_scheduling": bool(config.async_scheduling),
                "records": records,
                "tokenize": tokenize,
            }
        )
    )


def _timed_call(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def fit_engine(data: dict) -> dict[str, float]:
    """Per-step CPU seconds: fixed + per scheduled request (decode steps), and the extra of admitting requests.

    Counted: `Scheduler.schedule`, `Scheduler.update_from_output` and `sample_tokens` minus the sampler
    (output bookkeeping): the same code on a GPU server. Not counted: `execute_model` minus the forward,
    because on the CPU backend it is the CPU attention backend's metadata and eager-mode work, ~0.3 ms per
    request per step here, where a GPU server builds FlashAttention metadata and replays a CUDA graph:
    other code, which this build cannot time (kept in the raw data as `execute` - `forward`).
    """
    steps = []
    for r in data["records"]:
        if r.get("repeat", 0) == 0:
            continue  # the first pass warms caches and compiles
        cpu = r.get("schedule", 0) + r.get("sample_tokens", 0) - r.get("sampler", 0) + r.get("update", 0)
        steps.append((r, cpu))
    decode = [(r["scheduled"], cpu) for r, cpu in steps if r["new"] == 0 and r["scheduled"] > 0 and not r["finished"]]
    by_b: dict[int, list[float]] = {}
    for b, cpu in decode:
        by_b.setdefault(b, []).append(cpu)
    bs = sorted(by_b)
    med = [statistics.median(by_b[b]) for b in bs]
    step_fixed, per_request = linear_fit([[1, b] for b in bs], med)
    admit = [(r["new"], cpu - (step_fixed + per_request * r["scheduled"])) for r, cpu in steps if r["new"] > 0]
    admit_fixed, per_admitted = linear_fit([[1, n] for n, _ in admit], [x for _, x in admit])
    api = [(r["scheduled"], r["api_outputs"]) for r, _ in steps if r.get("api_outputs") and r["new"] == 0]
    api_by_b: dict[int, list[float]] = {}
    for b, x in api:
        api_by_b.setdefault(b, []).append(x)
    abs_ = sorted(api_by_b)
    out_fixed, out_per_token = linear_fit([[1, b] for b in abs_], [statistics.median(api_by_b[b]) for b in abs_])
    tok = data["tokenize"]
    tok_fixed, tok_per_token = linear_fit([[1, t["tokens"]] for t in tok], [t["seconds"] for t in tok])
    return {
        "step_s": step_fixed,
        "per_scheduled_request_s": per_request,
        "admit_step_s": max(0.0, admit_fixed),
        "per_admitted_request_s": max(0.0, per_admitted),
        "output_step_s": out_fixed,
        "output_per_token_s": out_per_token,
        "tokenize_fixed_s": tok_fixed,
        "tokenize_per_token_s": tok_per_token,
        "decode_medians_ms": {str(b): 1e3 * m for b, m in zip(bs, med)},
        "decode_parts_ms": {
            str(b): {
                k: 1e3 * statistics.median(r.get(k, 0.0) for r, _ in steps if r["scheduled"] == b and r["new"] == 0)
                for k in ("schedule", "execute", "forward", "sample_tokens", "sampler", "update")
            }
            for b in bs
        },
        "steps": len(steps),
    }


def measure_engine(vllm_python: Path, model_dir: Path, deadline_s: float) -> dict:
    # One OpenMP thread: torch's parallel regions on a shared 2-core host spin-wait in the timed thread, which is
    # neither the Python being measured nor what a GPU server's host does.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(vllm_python), __file__, "--engine-worker", str(model_dir), "--deadline", str(deadline_s)],
        capture_output=True,
        text=True,
        env=env,
        timeout=deadline_s + 300,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"engine worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- 2. the API server, as served ------------------------------------------------------------------------

WORDS_PER_128_TOKENS = 21
"""The tiny model's tokenizer makes ~6 tokens of each `w12345` word: 21 words are ~128 prompt tokens."""
CAPACITY_CONCURRENCY = 128
"""Streams in flight while the API server's capacity is measured: every engine step carries many requests' tokens."""
CAPACITY_SCENARIOS = (
    # (name, prompt words, output tokens, stream, requests, concurrency)
    ("128/1 stream", 21, 1, True, 1200, CAPACITY_CONCURRENCY),
    ("128/4 stream", 21, 4, True, 1200, CAPACITY_CONCURRENCY),
    ("128/4 non-stream", 21, 4, False, 1200, CAPACITY_CONCURRENCY),
    ("1024/1 stream", 171, 1, True, 600, CAPACITY_CONCURRENCY),
    ("128/64 stream", 21, 64, True, 500, CAPACITY_CONCURRENCY),
    ("128/64 non-stream", 21, 64, False, 500, CAPACITY_CONCURRENCY),
    # the old method's concurrency, for the comparison in docs/simulator.md (not fitted)
    ("128/1 stream c=8", 21, 1, True, 300, 8),
    ("128/64 stream c=8", 21, 64, True, 96, 8),
)
CAPACITY_REPEATS = 2
LATENCY_SCENARIOS = (
    # (prompt words, output tokens), one request at a time
    (3, 1),
    (21, 1),
    (171, 1),
    (500, 1),
    (21, 32),
)
LATENCY_REQUESTS = 30
STEPS_METRIC = "vllm:iteration_tokens_total_count"
"""Engine steps that produced tokens: the API server's output handler runs once for each."""
LATENCY_METRICS = {
    "vllm_ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}
"""vLLM's own per-request histograms (their _sum/_count) that split a request's time at concurrency 1."""


def _threads(pid: int) -> dict[str, list]:
    """{tid: [thread name, CPU ns]} of every thread of `pid` (schedstat's first field is the thread's run time)."""
    out: dict[str, list] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[task.name] = [(task / "comm").read_text().strip(), int((task / "schedstat").read_text().split()[0])]
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended between listing and reading
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`: vLLM's API server forks the engine core, which forks the model's worker."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def _pin(pid: int, cpu: int | None) -> None:
    """Pin every thread of `pid` to one core, or to all (None); threads started later inherit their creator's."""
    cpus = os.sched_getaffinity(0) if cpu is None else {cpu}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except OSError:
            pass  # the thread ended


def client_worker() -> None:
    """Runs under vLLM's venv (aiohttp): send the requests of a JSON spec on stdin, print one JSON result.

    One aiohttp session and connection pool, as `vllm bench serve` has since vLLM 0.10. The server's
    threads are read from /proc right before the first request and right after the last, so the CPU
    times cover exactly the measured window.
    """
    import asyncio

    import aiohttp

    spec = json.loads(sys.stdin.read())
    url = spec["base_url"] + ("/v1/chat/completions" if spec.get("chat") else "/v1/completions")

    def snapshot() -> dict[str, dict]:
        return {str(pid): _threads(pid) for pid in spec["pids"]}

    async def one(session: aiohttp.ClientSession, gate: asyncio.Semaphore, prompt: str) -> dict:
        body = request_body(spec, prompt)
        async with gate:
            t_send = time.perf_counter()
            first, chunks, usage = None, 0, {}
            async with session.post(url, json=body) as resp:
                t_head = time.perf_counter()
                if resp.status != 200:
                    return {"error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
                if spec["stream"]:
                    async for line in resp.content:
                        if not line.startswith(b"data: {"):
                            continue
                        data = json.loads(line[6:])
                        if data.get("choices"):
                            chunks += 1
                            first = first or time.perf_counter()
                        usage = data.get("usage") or usage
                else:
                    usage = (await resp.json()).get("usage") or {}
                    first, chunks = time.perf_counter(), 1
            return {
                "send": t_send,
                "head": t_head,
                "first": first,
                "end": time.perf_counter(),
                "chunks": chunks,
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "output_tokens": usage.get("completion_tokens", 0),
            }

    async def run() -> dict:
        gate = asyncio.Semaphore(spec["concurrency"])
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=spec["deadline_s"])
        ) as session:
            before, t0, cpu0 = snapshot(), time.perf_counter(), time.process_time()
            rows = await asyncio.wait_for(
                asyncio.gather(*(one(session, gate, p) for p in spec["prompts"])), spec["deadline_s"]
            )
            wall, after, client_cpu = time.perf_counter() - t0, snapshot(), time.process_time() - cpu0
        return {"rows": rows, "wall_s": wall, "client_cpu_s": client_cpu, "before": before, "after": after}

    print(json.dumps(asyncio.run(run())))


def request_body(spec: dict, prompt: str) -> dict:
    """One request's JSON as `vllm bench serve` sends it: `--backend openai` (a prompt) or, with spec["chat"],
    `--backend openai-chat` (one user message whose content is one text part; vLLM 0.11's
    benchmarks/lib/endpoint_request_func.py)."""
    body = {"model": spec["model"], "ignore_eos": True, "temperature": 0, "stream": spec["stream"]}
    if spec.get("chat"):
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        body["max_completion_tokens"] = spec["max_tokens"]
    else:
        body["prompt"] = prompt
        body["max_tokens"] = spec["max_tokens"]
    if spec["stream"]:
        body["stream_options"] = {"include_usage": True}
    return body


def _thread_cpu(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """CPU seconds per process and thread over a window: {pid: {"name/tid": s}}, threads that ran at all."""
    out = {}
    for pid, threads in after.items():
        was = before.get(pid, {})
        out[pid] = {
            f"{name}/{tid}": (ns - was.get(tid, [name, 0])[1]) / 1e9
            for tid, (name, ns) in threads.items()
            if ns - was.get(tid, [name, 0])[1] > 0
        }
    return out


class ApiProbe:
    """A vLLM CPU server with its API process pinned to core 0 and its engine core (and the client) to core 1."""

    def __init__(self, vllm_python: Path, model_dir: Path, log: Path, extra_server_args: Sequence[str] = ()) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from servelab.targets.server_process import vllm_cpu_server

        self.vllm_python = vllm_python
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "1"  # the model's OpenMP threads on the engine's core
        self.server = vllm_cpu_server(
            vllm_python,
            model_dir,
            log_path=log,
            served_model_name="tiny",
            kv_cache_gib=2,
            extra_args=[
                "--dtype",
                "float32",
                "--max-model-len",
                "4096",
                "--max-num-seqs",
                "256",
                "--max-num-batched-tokens",
                "8192",
                "--no-enable-prefix-caching",
                *extra_server_args,
            ],
        )
        self.rng = random.Random(0)
        self.client_core = 1
        self.served_model_name = "tiny"
        """The core the load generator is pinned to while the server is pinned (1: the engine's)."""

    def __enter__(self) -> Self:
        self.server.start()
        self.pin()
        return self

    def pin(self) -> None:
        """The API server's process on core 0, the engine core and its worker on core 1."""
        self.api_pid = self.server.pid
        self.engine_pids = _descendants(self.api_pid)
        self.pinned = True
        _pin(self.api_pid, 0)
        for pid in self.engine_pids:
            _pin(pid, 1)

    def __exit__(self, *exc) -> None:
        self.server.stop()

    def unpin(self) -> None:
        self.pinned = False
        for pid in (self.api_pid, *self.engine_pids):
            _pin(pid, None)

    def prompt(self, words: int) -> str:
        return " ".join(f"w{self.rng.randrange(100000)}" for _ in range(words))

    def load(
        self,
        words: int,
        max_tokens: int,
        stream: bool,
        requests: int,
        concurrency: int,
        deadline_s: float,
        chat: bool = False,
    ) -> dict:
        """Run one client (pinned to core 1) to the end; its rows, wall time and the server's per-thread CPU.

        `chat` sends each prompt to /v1/chat/completions as one user message instead of to /v1/completions."""
        spec = {
            "base_url": self.server.base_url,
            "model": self.served_model_name,
            "max_tokens": max_tokens,
            "stream": stream,
            "chat": chat,
            "concurrency": concurrency,
            "deadline_s": deadline_s,
            "pids": [self.api_pid, *self.engine_pids],
            "prompts": [self.prompt(words) for _ in range(requests)],
        }
        steps0 = self.metrics().get(STEPS_METRIC, 0.0)
        proc = subprocess.Popen(
            [str(self.vllm_python), __file__, "--client-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if self.pinned:
            os.sched_setaffinity(proc.pid, {self.client_core})
        out, err = proc.communicate(json.dumps(spec), timeout=deadline_s + 60)
        if proc.returncode != 0:
            raise SystemExit(f"client worker failed:\n{err[-3000:]}")
        res = json.loads(out)
        errors = [r["error"] for r in res["rows"] if "error" in r]
        if errors:
            raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
        res["cpu"] = _thread_cpu(res.pop("before"), res.pop("after"))
        res["engine_steps"] = self.metrics().get(STEPS_METRIC, 0.0) - steps0
        return res

    def metrics(self) -> dict[str, float]:
        import urllib.request

        from servelab.metrics.scrape import parse_metrics

        with urllib.request.urlopen(self.server.base_url + "/metrics", timeout=10) as resp:
            return parse_metrics(resp.read().decode())

    def idle_threads(self, seconds: float = 3.0) -> dict[str, dict[str, float]]:
        """Per-thread CPU share while no request is in flight: which threads spin."""
        before = {str(p): _threads(p) for p in (self.api_pid, *self.engine_pids)}
        time.sleep(seconds)
        after = {str(p): _threads(p) for p in (self.api_pid, *self.engine_pids)}
        return {
            pid: {k: v / seconds for k, v in threads.items()} for pid, threads in _thread_cpu(before, after).items()
        }


def capacity_row(name: str, stream: bool, concurrency: int, res: dict, api_pid: int) -> dict:
    """One saturation scenario: throughput, and the API process's CPU per request, main thread and all threads."""
    rows, wall = res["rows"], res["wall_s"]
    n = len(rows)
    api = res["cpu"][str(api_pid)]
    main = sum(v for k, v in api.items() if k.endswith(f"/{api_pid}"))
    return {
        "scenario": name,
        "stream": stream,
        "concurrency": concurrency,
        "requests": n,
        "wall_s": wall,
        "prompt_tokens": statistics.mean(r["prompt_tokens"] for r in rows),
        "output_tokens": statistics.mean(r["output_tokens"] for r in rows),
        "chunks_per_request": statistics.mean(r["chunks"] for r in rows),
        "requests_per_s": n / wall,
        "output_tokens_per_s": sum(r["output_tokens"] for r in rows) / wall,
        "api_main_thread_busy": main / wall,
        "api_main_thread_s_per_request": main / n,
        "api_all_threads_s_per_request": sum(api.values()) / n,
        "client_cpu_s_per_request": res.get("client_cpu_s", float("nan")) / n,
        "engine_steps_per_request": res.get("engine_steps", float("nan")) / n,
        "engine_busy": {
            pid: sum(threads.values()) / wall for pid, threads in res["cpu"].items() if pid != str(api_pid)
        },
        "threads_s": {
            pid: {k: round(v, 4) for k, v in sorted(t.items(), key=lambda kv: -kv[1])[:8]}
            for pid, t in res["cpu"].items()
        },
    }


def latency_row(words: int, max_tokens: int, res: dict, m0: dict, m1: dict) -> dict:
    """Concurrency 1: the client's TTFT split by vLLM's own per-request histograms (means, ms)."""
    rows = res["rows"]

    def mean(xs: list[float]) -> float:
        return 1e3 * statistics.mean(xs)

    out = {
        "prompt_tokens": statistics.mean(r["prompt_tokens"] for r in rows),
        "output_tokens": max_tokens,
        "requests": len(rows),
        "client_headers_ms": mean([r["head"] - r["send"] for r in rows]),
        "client_ttft_ms": mean([r["first"] - r["send"] for r in rows]),
        "client_e2e_ms": mean([r["end"] - r["send"] for r in rows]),
        "client_tpot_ms": mean([(r["end"] - r["first"]) / (r["output_tokens"] - 1) for r in rows])
        if max_tokens > 1
        else None,
    }
    for key, metric in LATENCY_METRICS.items():
        count = m1.get(metric + "_count", 0) - m0.get(metric + "_count", 0)
        out[f"{key}_ms"] = 1e3 * (m1.get(metric + "_sum", 0) - m0.get(metric + "_sum", 0)) / count if count else None
    return out


def measure_api(vllm_python: Path, model_dir: Path, deadline_s: float, quick: bool = False) -> dict:
    log = Path("/tmp") / f"cpu-side-costs-{os.getpid()}.log"
    with ApiProbe(vllm_python, model_dir, log) as probe:
        t0 = time.monotonic()
        probe.load(21, 4, True, 64, 16, deadline_s)  # warm-up: first requests compile and fill caches
        idle = probe.idle_threads()
        print(f"  idle threads (CPU share): {json.dumps(idle)}", file=sys.stderr, flush=True)
        capacity = []
        for repeat in range(CAPACITY_REPEATS):
            for name, words, out, stream, n, concurrency in CAPACITY_SCENARIOS:
                n = max(concurrency, n // 8) if quick else n
                res = probe.load(words, out, stream, n, concurrency, deadline_s)
                capacity.append({**capacity_row(name, stream, concurrency, res, probe.api_pid), "repeat": repeat})
                c = capacity[-1]
                print(
                    f"  capacity {name}: {c['requests_per_s']:.1f} req/s {c['output_tokens_per_s']:.0f} tok/s, "
                    f"{c['chunks_per_request']:.2f} chunks/req, API main thread busy {c['api_main_thread_busy']:.2f}, "
                    f"{1e3 * c['api_main_thread_s_per_request']:.3f} ms main / "
                    f"{1e3 * c['api_all_threads_s_per_request']:.3f} ms all threads per request; "
                    f"engine busy {c['engine_busy']}",
                    file=sys.stderr,
                    flush=True,
                )
                if time.monotonic() - t0 > deadline_s:
                    raise SystemExit("API-server measurement ran past its time limit")
        probe.unpin()  # concurrency 1: let the OS place the processes, as a GPU host with free cores would
        latency = []
        for words, out in LATENCY_SCENARIOS:
            m0 = probe.metrics()
            res = probe.load(words, out, True, LATENCY_REQUESTS // (3 if quick else 1), 1, deadline_s)
            latency.append(latency_row(words, out, res, m0, probe.metrics()))
            rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in latency[-1].items()}
            print(
                f"  c=1 latency: {json.dumps(rounded)}",
                file=sys.stderr,
                flush=True,
            )
            if time.monotonic() - t0 > deadline_s:
                raise SystemExit("API-server measurement ran past its time limit")
    return {
        "idle_threads": idle,
        "capacity": capacity,
        "latency": latency,
        "concurrency": CAPACITY_CONCURRENCY,
        **fit_api(capacity),
    }


def fit_api(capacity: list[dict]) -> dict:
    """The API server's serial costs from the saturated scenarios, per request, prompt token, output token and chunk.

    The serial part is the event-loop (main) thread: HTTP, validation, the output handler (detokenize, build
    each request's output, per token) and each SSE chunk (wake the request's task, serialize, write; per
    chunk, and chunks merge under load), and once per engine step the output handler's own work (receive and
    decode the step's outputs, iteration stats, Prometheus). Its CPU per request is fitted as fixed + per
    prompt token x P + per token x O + (streamed only) a stream's own start and end + per chunk x chunks +
    per engine step x the steps per request (each step's count over the requests in flight). Low-concurrency
    rows (few tokens a step) are what separate the per-step cost from the per-token one.
    The other threads (the renderer's tokenizer pool, ZMQ's I/O thread) run beside the loop; their CPU per
    request is fitted as fixed + per prompt token x P and reported separately.
    """
    counted = all(r.get("engine_steps_per_request", float("nan")) >= 0 for r in capacity)
    # Raw files from before the step count was taken: the saturated rows only, no per-step term.
    rows = capacity if counted else [r for r in capacity if r["concurrency"] == CAPACITY_CONCURRENCY]
    x = [
        [
            1.0,
            r["prompt_tokens"],
            r["output_tokens"],
            float(r["stream"]),
            r["chunks_per_request"] * r["stream"],
            *([r["engine_steps_per_request"]] if counted else []),
        ]
        for r in rows
    ]
    loop = linear_fit(x, [r["api_main_thread_s_per_request"] for r in rows])
    if not counted:
        loop.append(0.0)
    off_y = [r["api_all_threads_s_per_request"] - r["api_main_thread_s_per_request"] for r in rows]
    off = linear_fit([[1.0, r["prompt_tokens"]] for r in rows], off_y)
    residuals = {
        f"{r['scenario']} #{r['repeat']}": round(
            sum(c * v for c, v in zip(loop, xi)) / r["api_main_thread_s_per_request"] - 1, 3
        )
        for r, xi in zip(rows, x)
    }
    return {
        "per_request_s": loop[0] + loop[3],
        "per_request_non_stream_s": loop[0],
        "loop_per_prompt_token_s": loop[1],
        "per_token_s": loop[2],
        "per_chunk_s": loop[4],
        "per_engine_step_s": loop[5],
        "off_loop_per_request_s": off[0],
        "off_loop_per_prompt_token_s": off[1],
        "per_prompt_token_s": loop[1] + off[1],
        "per_output_token_s": loop[2] + loop[4],
        "fit_relative_residuals": residuals,
    }


def fit_latency(latency: list[dict]) -> dict[str, float]:
    """Concurrency 1: the client's TTFT less vLLM's queue and prefill, as fixed + per prompt token (seconds).

    Everything between the client's send and its first token that is not the model's work: HTTP,
    tokenization, the ZMQ hops, the output handler, the chunk's way out. Part of it is the event loop's
    CPU (charged serially by the fit above); the rest is latency that occupies no core.
    """
    rows = [r for r in latency if r["output_tokens"] == 1]
    fixed, per_token = linear_fit(
        [[1.0, r["prompt_tokens"]] for r in rows],
        [(r["client_ttft_ms"] - r["queue_ms"] - r["prefill_ms"]) / 1e3 for r in rows],
    )
    return {"c1_overhead_s": fixed, "c1_overhead_per_prompt_token_s": per_token}


# -- 3. the data file --------------------------------------------------------------------------------------


IN_PROCESS_KEYS = ("output_step_s", "output_per_token_in_process_s", "tokenize_per_token_in_process_s")
"""API-side costs timed inside the engine worker (part 1), kept beside the served measurement for comparison."""


def engine_section(fitted: dict) -> dict:
    return {
        "step_s": fitted["step_s"],
        "per_scheduled_request_s": fitted["per_scheduled_request_s"],
        "admit_step_s": fitted["admit_step_s"],
        "per_admitted_request_s": fitted["per_admitted_request_s"],
        "decode_step_medians_ms": fitted["decode_medians_ms"],
        "steps_timed": fitted["steps"],
    }


def in_process(fitted: dict) -> dict:
    return dict(
        zip(IN_PROCESS_KEYS, (fitted["output_step_s"], fitted["output_per_token_s"], fitted["tokenize_per_token_s"]))
    )


def api_section(api: dict, in_proc: dict) -> dict:
    """The data file's api_server section: the fitted serial costs, then every scenario's numbers."""
    keep = (
        "scenario",
        "stream",
        "concurrency",
        "repeat",
        "requests",
        "wall_s",
        "prompt_tokens",
        "output_tokens",
        "chunks_per_request",
        "requests_per_s",
        "output_tokens_per_s",
        "api_main_thread_busy",
        "api_main_thread_s_per_request",
        "api_all_threads_s_per_request",
        "client_cpu_s_per_request",
        "engine_steps_per_request",
    )
    return {
        "method": "event-loop (main) thread CPU per request of the API process, API process pinned to its own "
        f"core, {api['concurrency']} streams in flight (and 8, which separate the per-step cost); "
        "least squares over the loads under `capacity`",
        "per_request_s": api["per_request_s"],
        "per_request_non_stream_s": api["per_request_non_stream_s"],
        "per_prompt_token_s": api["per_prompt_token_s"],
        "per_output_token_s": api["per_output_token_s"],
        "per_token_s": api["per_token_s"],
        "per_chunk_s": api["per_chunk_s"],
        "per_engine_step_s": api["per_engine_step_s"],
        "loop_per_prompt_token_s": api["loop_per_prompt_token_s"],
        "off_loop_per_request_s": api["off_loop_per_request_s"],
        "off_loop_per_prompt_token_s": api["off_loop_per_prompt_token_s"],
        **fit_latency(api["latency"]),
        **in_proc,
        "measured_concurrency": api["concurrency"],
        "fit_relative_residuals": api["fit_relative_residuals"],
        "idle_threads_cpu_share": api["idle_threads"],
        "capacity": [{k: r[k] for k in keep if k in r} for r in api["capacity"]],
        "latency_c1": api["latency"],
    }


def write_yaml(out: Path, doc: dict) -> None:
    import yaml

    out.write_text(
        "# vLLM's CPU-side costs measured on the vLLM CPU build with the tiny model; see the module docstring of\n"
        "# benchmarks/cpu_side_costs.py and docs/simulator.md. Seconds of CPU on the host described under `host`.\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )


def full_doc(engine: dict, api: dict, fitted: dict, reference_s: float) -> dict:
    return {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "flock-guarded: .venv/bin/python benchmarks/cpu_side_costs.py",
        "vllm_version": engine["vllm_version"],
        "async_scheduling_in_measurement": engine["async_scheduling"],
        "host": {
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "reference_loop_s": round(reference_s, 4),
            "note": "best of 5 runs of benchmarks/cpu_side_costs.py:reference_loop_s on this host",
        },
        "engine_core": engine_section(fitted),
        "gpu_host": GPU_HOST,
        "api_server": api_section(api, in_process(fitted)),
    }


def update_api(out: Path, api: dict) -> None:
    """Replace the data file's api_server section, keeping its engine-core part and in-process numbers."""
    import yaml

    old = yaml.safe_load(out.read_text())
    doc = {}
    for key, value in old.items():
        if key not in ("api_measured_at", "api_command"):
            doc[key] = value
        if key == "command":  # the API server's own date and command, next to the file's
            doc["api_measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            doc["api_command"] = (
                "flock-guarded: .venv/bin/python benchmarks/cpu_side_costs.py --api-only --raw api.json"
            )
    doc["api_server"] = api_section(api, {k: old["api_server"][k] for k in IN_PROCESS_KEYS})
    write_yaml(out, doc)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--client-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--api-only",
        action="store_true",
        help="re-measure the API server only: its section of --out is replaced, the rest kept",
    )
    ap.add_argument("--quick", action="store_true", help="fewer requests per scenario (a smoke run)")
    ap.add_argument("--deadline", type=float, default=600.0, help="time limit of each part, seconds")
    ap.add_argument("--vllm-python", type=Path, default=CACHE / "vllm-venv" / "bin" / "python")
    ap.add_argument("--model-dir", type=Path, default=CACHE / "tiny-model")
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "servelab/perf/data/vllm_cpu_costs.yaml"
    )
    ap.add_argument("--raw", type=Path, help="also write the raw measurements as JSON here")
    ap.add_argument("--from-raw", type=Path, help="only rewrite --out from raw measurements written by --raw")
    args = ap.parse_args()
    if args.engine_worker:
        engine_worker(args.engine_worker, args.deadline)
        return
    if args.client_worker:
        client_worker()
        return
    if args.api_only:
        with heavy_lock():
            api = measure_api(args.vllm_python, args.model_dir, args.deadline, args.quick)
        if args.raw:
            args.raw.write_text(json.dumps({"api": api}))
        update_api(args.out, api)
    elif args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        raw["api"].update(fit_api(raw["api"]["capacity"]))
        if "engine" in raw:
            write_yaml(args.out, full_doc(raw["engine"], raw["api"], fit_engine(raw["engine"]), raw["reference_s"]))
        else:
            update_api(args.out, raw["api"])
    else:
        reference = reference_loop_s()
        print(f"reference loop {reference:.4f} s", file=sys.stderr, flush=True)
        with heavy_lock():  # once for both parts, so no other heavy run lands between them
            engine = measure_engine(args.vllm_python, args.model_dir, args.deadline)
            fitted = fit_engine(engine)
            print(f"engine core: {json.dumps(fitted)}", file=sys.stderr, flush=True)
            api = measure_api(args.vllm_python, args.model_dir, args.deadline)
        if args.raw:
            args.raw.write_text(json.dumps({"engine": engine, "api": api, "reference_s": reference}))
        write_yaml(args.out, full_doc(engine, api, fitted, reference))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
