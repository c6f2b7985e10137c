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
2. API server, as served (`python -m vllm.entrypoints.openai.api_server`):
   the API-server process's CPU time (all its threads, /proc schedstat, ns)
   per streamed completion, over prompt lengths 16..2048 and 1..256 output
   tokens, minus its idle rate; fitted per request + per prompt token + per
   output token.
3. The host's single-core speed: the best of 5 runs of a fixed pure-Python
   reference loop, so a GPU server's costs are these x (its loop time / ours).

Every server or engine run holds `flock /tmp/servelab-heavy.lock`; every load
loop is bounded in count and in time; only the processes started here are
stopped, by their process group.

    .venv/bin/python benchmarks/cpu_side_costs.py [--out servelab/perf/data/vllm_cpu_costs.yaml]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

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
    """Least squares without numpy (the engine worker runs in vLLM's venv, the rest in servelab's)."""
    import numpy as np

    coef, *_ = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys, dtype=float), rcond=None)
    return [float(c) for c in coef]


# -- 1. engine core, in process (runs under the vLLM venv's python) -----------------------------------------


def engine_worker(model_dir: str, deadline_s: float) -> None:
    """Time every engine-core step's CPU work; prints one JSON object of per-step records."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    timers: dict[str, float] = {}

    def timed(cls: type, name: str, key: str, batch_hook=None) -> None:
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            # CPU time of this thread: the engine core's Python runs on one thread, and a shared host's other
            # jobs must not count (torch's kernels in its worker threads are not this thread's time either).
            t0 = time.thread_time()
            out = original(self, *args, **kwargs)
            timers[key] = timers.get(key, 0.0) + time.thread_time() - t0
            if batch_hook is not None:
                batch_hook(out)
            return out

        setattr(cls, name, wrapper)

    batch: dict[str, int] = {}

    def record_batch(out) -> None:
        batch["scheduled"] = len(out.num_scheduled_tokens)
        batch["new"] = len(out.scheduled_new_reqs)
        batch["tokens"] = out.total_num_scheduled_tokens
        batch["finished"] = len(out.finished_req_ids)

    timed(Scheduler, "schedule", "schedule", record_batch)
    timed(Scheduler, "update_from_output", "update")
    timed(GPUModelRunner, "execute_model", "execute")
    timed(GPUModelRunner, "_model_forward", "forward")
    timed(GPUModelRunner, "sample_tokens", "sample_tokens")
    timed(GPUModelRunner, "_sample", "sampler")
    timed(OutputProcessor, "process_outputs", "api_outputs")

    llm = LLM(model=model_dir, max_model_len=4096, max_num_seqs=max(ENGINE_BATCHES), max_num_batched_tokens=8192,
              distributed_executor_backend="uni", enable_prefix_caching=False, seed=0)
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
    print(json.dumps({"vllm_version": _vllm_version(), "async_scheduling": bool(config.async_scheduling),
                      "records": records, "tokenize": tokenize}))


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
        "step_s": step_fixed, "per_scheduled_request_s": per_request,
        "admit_step_s": max(0.0, admit_fixed), "per_admitted_request_s": max(0.0, per_admitted),
        "output_step_s": out_fixed, "output_per_token_s": out_per_token,
        "tokenize_fixed_s": tok_fixed, "tokenize_per_token_s": tok_per_token,
        "decode_medians_ms": {str(b): 1e3 * m for b, m in zip(bs, med)},
        "decode_parts_ms": {str(b): {k: 1e3 * statistics.median(r.get(k, 0.0) for r, _ in steps
                                                                  if r["scheduled"] == b and r["new"] == 0)
                                     for k in ("schedule", "execute", "forward", "sample_tokens", "sampler", "update")}
                            for b in bs},
        "steps": len(steps),
    }


def measure_engine(vllm_python: Path, model_dir: Path, deadline_s: float) -> dict:
    # One OpenMP thread: torch's parallel regions on a shared 2-core host spin-wait in the timed thread, which is
    # neither the Python being measured nor what a GPU server's host does.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(vllm_python), __file__, "--engine-worker", str(model_dir), "--deadline", str(deadline_s)],
        capture_output=True, text=True, env=env, timeout=deadline_s + 300,
    )
    if proc.returncode != 0:
        raise SystemExit(f"engine worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- 2. the API server, as served ------------------------------------------------------------------------


def _cpu_ns(pid: int) -> int:
    """CPU time of all threads of a process, in ns (schedstat's first field)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended between listing and reading
    return total


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _stream_completion(base_url: str, model: str, prompt: str, max_tokens: int, timeout: float) -> int:
    """One streamed completion, read to the end; returns the prompt tokens the server counted."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    data = conn.getresponse().read().decode()
    conn.close()
    prompt_tokens = 0
    for line in data.splitlines():
        if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
            usage = json.loads(line[6:]).get("usage") or {}
            prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
    return prompt_tokens


def measure_api(vllm_python: Path, model_dir: Path, requests: int, deadline_s: float) -> dict:
    import random
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from servelab.targets.server_process import vllm_cpu_server

    rng = random.Random(0)
    rows = []
    log = Path("/tmp") / f"cpu-side-costs-{os.getpid()}.log"
    server = vllm_cpu_server(vllm_python, model_dir, log_path=log, served_model_name="tiny",
                             kv_cache_gib=2, extra_args=["--max-model-len", "4096", "--max-num-seqs", "64",
                                                         "--no-enable-prefix-caching"])
    with server:
        api_pid = server.pid
        engine_pids = _children(api_pid)
        t0 = time.monotonic()
        idle0, w0 = _cpu_ns(api_pid), time.monotonic()
        time.sleep(3.0)
        idle_rate = (_cpu_ns(api_pid) - idle0) / 1e9 / (time.monotonic() - w0)

        def prompt_of(words: int) -> str:
            return " ".join(f"w{rng.randrange(100000)}" for _ in range(words))

        for words, out in API_SCENARIOS:
            for warm in (True, False):
                n = API_CONCURRENCY if warm else requests
                prompts = [prompt_of(words) for _ in range(n)]
                c0, e0, w0 = _cpu_ns(api_pid), sum(_cpu_ns(p) for p in engine_pids), time.monotonic()
                with ThreadPoolExecutor(API_CONCURRENCY) as pool:
                    counted = list(pool.map(
                        lambda p: _stream_completion(server.base_url, "tiny", p, out, 120.0), prompts))
                wall = time.monotonic() - w0
                api_s = (_cpu_ns(api_pid) - c0) / 1e9 - idle_rate * wall
                engine_s = (sum(_cpu_ns(p) for p in engine_pids) - e0) / 1e9
                if not warm:
                    rows.append({"prompt_tokens": statistics.mean(counted), "output_tokens": out,
                                 "requests": n, "api_cpu_s_per_request": api_s / n,
                                 "engine_cpu_s_per_request": engine_s / n, "wall_s": wall})
                    print(f"  api: prompt {rows[-1]['prompt_tokens']:.0f} out {out}: "
                          f"{1e3 * api_s / n:.3f} ms API CPU / request", file=sys.stderr, flush=True)
                if time.monotonic() - t0 > deadline_s:
                    raise SystemExit("API-server measurement ran past its time limit")
    return {"rows": rows, "idle_cpu_share": idle_rate, "concurrency": API_CONCURRENCY, **fit_api(rows)}


def fit_api(rows: list[dict]) -> dict[str, float]:
    """API-server CPU per request = fixed + per prompt token + per output token, over the scenarios that were served."""
    served = [r for r in rows if r["prompt_tokens"] > 0]  # a refused request (prompt too long) counts no tokens
    fixed, per_prompt, per_output = linear_fit(
        [[1, r["prompt_tokens"], r["output_tokens"]] for r in served], [r["api_cpu_s_per_request"] for r in served])
    return {"per_request_s": fixed, "per_prompt_token_s": per_prompt, "per_output_token_s": per_output,
            "scenarios_fitted": len(served)}


# -- 3. the data file --------------------------------------------------------------------------------------


def write_yaml(out: Path, engine: dict, api: dict, fitted_engine: dict, reference_s: float) -> None:
    import yaml

    doc = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "flock-guarded: .venv/bin/python benchmarks/cpu_side_costs.py",
        "vllm_version": engine["vllm_version"],
        "async_scheduling_in_measurement": engine["async_scheduling"],
        "host": {"cpu": _cpu_model(), "python": platform.python_version(), "reference_loop_s": round(reference_s, 4),
                 "note": "best of 5 runs of benchmarks/cpu_side_costs.py:reference_loop_s on this host"},
        "engine_core": {
            "step_s": fitted_engine["step_s"],
            "per_scheduled_request_s": fitted_engine["per_scheduled_request_s"],
            "admit_step_s": fitted_engine["admit_step_s"],
            "per_admitted_request_s": fitted_engine["per_admitted_request_s"],
            "decode_step_medians_ms": fitted_engine["decode_medians_ms"],
            "steps_timed": fitted_engine["steps"],
        },
        "gpu_host": GPU_HOST,
        "api_server": {
            "per_request_s": api["per_request_s"],
            "per_prompt_token_s": api["per_prompt_token_s"],
            "per_output_token_s": api["per_output_token_s"],
            "output_step_s": fitted_engine["output_step_s"],
            "output_per_token_in_process_s": fitted_engine["output_per_token_s"],
            "tokenize_per_token_in_process_s": fitted_engine["tokenize_per_token_s"],
            "measured_concurrency": api["concurrency"],
            "rows": api["rows"],
        },
    }
    out.write_text(
        "# vLLM's CPU-side costs measured on the vLLM CPU build with the tiny model; see the module docstring of\n"
        "# benchmarks/cpu_side_costs.py and docs/simulator.md. Seconds of CPU on the host described under `host`.\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=600.0, help="time limit of each part, seconds")
    ap.add_argument("--vllm-python", type=Path, default=CACHE / "vllm-venv" / "bin" / "python")
    ap.add_argument("--model-dir", type=Path, default=CACHE / "tiny-model")
    ap.add_argument("--requests", type=int, default=64, help="requests per API-server scenario")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "servelab/perf/data/vllm_cpu_costs.yaml")
    ap.add_argument("--raw", type=Path, help="also write the raw measurements as JSON here")
    ap.add_argument("--from-raw", type=Path, help="only rewrite --out from raw measurements written by --raw")
    ap.add_argument("--engine-only", action="store_true", help="re-measure the engine core only, into the --raw file")
    args = ap.parse_args()
    if args.engine_worker:
        engine_worker(args.engine_worker, args.deadline)
        return
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        raw["api"].update(fit_api(raw["api"]["rows"]))
        write_yaml(args.out, raw["engine"], raw["api"], fit_engine(raw["engine"]), raw["reference_s"])
        return
    if args.engine_only:
        raw = json.loads(args.raw.read_text())
        with heavy_lock():
            raw["engine"] = measure_engine(args.vllm_python, args.model_dir, args.deadline)
        print(f"engine core: {json.dumps(fit_engine(raw['engine']))}", file=sys.stderr, flush=True)
        args.raw.write_text(json.dumps(raw))
        write_yaml(args.out, raw["engine"], raw["api"], fit_engine(raw["engine"]), raw["reference_s"])
        return
    reference = reference_loop_s()
    print(f"reference loop {reference:.4f} s", file=sys.stderr, flush=True)
    with heavy_lock():  # once for both parts, so no other heavy run lands between them
        engine = measure_engine(args.vllm_python, args.model_dir, args.deadline)
        fitted = fit_engine(engine)
        print(f"engine core: {json.dumps(fitted)}", file=sys.stderr, flush=True)
        api = measure_api(args.vllm_python, args.model_dir, args.requests, args.deadline)
    if args.raw:
        args.raw.write_text(json.dumps({"engine": engine, "api": api, "fitted_engine": fitted, "reference_s": reference}))
    write_yaml(args.out, engine, api, fitted, reference)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
