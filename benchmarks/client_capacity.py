"""How fast and how accurate is servelab's streaming client, against vLLM's, AIPerf's and GuideLLM's, in one run.

Three processes: a fast SSE server (this file, `server` mode, stdlib asyncio
only), servelab's HttpTarget (this process), and vLLM's benchmark harness
(`vllm.benchmarks.serve.benchmark`, driven from the vLLM venv in
`vllm-client` mode). The server behaves like an engine: every step it writes
one chunk to every open stream, back to back, then yields; it never buffers
past the socket (flow control), so a slow client slows the stream instead of
hiding behind a buffer. It stamps, per request, when it wrote the first
chunk; the client's first-token time minus that stamp is the TTFT the client
itself adds. Both processes read CLOCK_MONOTONIC (time.perf_counter), which
is shared by all processes on a Linux host.

Clients: `servelab` (HttpTarget through run_point, in this process: what
`servelab bench` does per point, records to JSONL included; CPU counted from
the run's start), `servelab-cli` (the `servelab bench` command as a fresh
process: CPU of the whole process, start-up included), `vllm` (vLLM's
benchmark(), CPU counted both ways: in its run, and its whole process),
`aiperf` (`aiperf profile`, aiperf==0.13.0, output tokens from the server's
usage field as the server counts them) and `guidellm` (`guidellm run` from a
scenario file, guidellm==0.8.1): each peer's command as its users run it,
from its own venv, CPU of the whole process tree. For every client started as
a process, the capacity phase also runs the same command with one wave of
requests: (CPU of the run - CPU of the one wave) / (chunks - chunks) is the
marginal CPU per chunk, start-up taken out. A peer that is not installed or
fails is named with its error under the table; the others still run.

Peers' venvs (outside the heavy lock; the tiny model's tokenizer builds their prompts, $SERVELAB_TINY_MODEL):
  python3 -m venv ~/.cache/servelab/aiperf-venv && ~/.cache/servelab/aiperf-venv/bin/pip install aiperf==0.13.0
  python3 -m venv ~/.cache/servelab/guidellm-venv && ~/.cache/servelab/guidellm-venv/bin/pip install guidellm==0.8.1

Two phases per client:
  capacity  closed loop at --concurrency streams, unpaced server: chunks/s and
            requests/s as measured by the server (same yardstick for every client)
  accuracy  --concurrency streams, server paced: each request's first chunk
            exactly --ttft-ms after its arrival, then one chunk per stream every
            --step-ms. Client-added TTFT is measured from both ends: from the
            server's first write (client first-token time - write stamp) and from
            the request's arrival (client TTFT - server TTFT, i.e. also what the
            client adds between stamping the send and the server reading the
            request); client-added ITL is the client's gap minus the server's gap
            between the same two writes; first-wave TTFT is set against later waves'.

Usage (from the repository root):
  .venv/bin/python benchmarks/client_capacity.py [--requests 2048] [--concurrency 256] [--out rows.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

VLLM_PYTHON = Path.home() / ".cache/servelab/vllm-venv/bin/python"
AIPERF = Path.home() / ".cache/servelab/aiperf-venv/bin/aiperf"
"""aiperf==0.13.0 in its own venv: `python3 -m venv ~/.cache/servelab/aiperf-venv && .../pip install aiperf==0.13.0`."""
GUIDELLM = Path.home() / ".cache/servelab/guidellm-venv/bin/guidellm"
"""guidellm==0.8.1 in its own venv, made the same way."""
TOKENIZER = Path(os.environ.get("SERVELAB_TINY_MODEL", Path.home() / ".cache/servelab/tiny-model"))
"""AIPerf and GuideLLM build their prompts with a Hugging Face tokenizer: the tiny model's, made locally."""
MODEL = "bench-model"

# --------------------------------------------------------------------------- server


class _Stream:
    __slots__ = ("conn", "req_id", "n", "sent", "chunk")

    def __init__(self, conn: _Conn, req_id: str, n: int, chunk: bytes) -> None:
        self.conn, self.req_id, self.n, self.sent, self.chunk = conn, req_id, n, 0, chunk


class _Engine:
    """Writes one chunk per open stream per step, as fast as the sockets accept them."""

    CHUNK = (
        b'data: {"id":"cmpl-%08d","object":"text_completion","model":"bench-model",'
        b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
    )
    """Every stream's chunks carry its arrival number as the response id: GuideLLM records that id per request
    (its text prompts carry none of their own), so its timings can be paired with the server's stamps."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.ttft_s = 0.0
        self.streams: list[_Stream] = []
        self.wake = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        self.seq = 0
        self.chunks = 0
        self.requests = 0
        self.cpu0 = time.process_time()
        self.first_arrival: float | None = None
        self.last_done = 0.0
        self.arrival: dict[str, float] = {}
        """When each request's bytes were parsed: where "from the request's arrival" starts."""
        self.first_write: dict[str, float] = {}
        self.writes: dict[str, list[float]] = {}
        """Paced runs only: the time of every chunk write, for the client-added inter-token gap."""

    def add(self, stream: _Stream) -> None:
        now = time.perf_counter()
        if self.first_arrival is None:
            self.first_arrival = now
        self.arrival[stream.req_id] = now
        if self.ttft_s:  # an exact, per-request TTFT: the first wave and later ones meet the same server
            asyncio.get_running_loop().call_later(self.ttft_s, self._first_token, stream)
            return
        self.streams.append(stream)
        self.wake.set()

    def _first_token(self, stream: _Stream) -> None:
        if not stream.conn.closed and not stream.conn.paused:
            self._write(stream)
        if stream.sent < stream.n:
            self.streams.append(stream)
            self.wake.set()

    def _write(self, s: _Stream) -> bool:
        """Write one chunk (and the end of the stream after the last); True when the stream is finished."""
        now = time.perf_counter()
        if s.sent == 0:
            self.first_write[s.req_id] = now
        if self.step_s:
            self.writes.setdefault(s.req_id, []).append(now)
        conn = s.conn
        conn.transport.write(s.chunk)
        s.sent += 1
        self.chunks += 1
        if s.sent < s.n:
            return False
        usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\n' % s.n
        conn.transport.write(self._frame(usage) + self._frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.requests += 1
        self.last_done = now
        return True

    @staticmethod
    def _frame(payload: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    def stream(self, conn: _Conn, request_id: str | None, n: int) -> _Stream:
        """A new stream, keyed by the client's own request id when it has one, else by its arrival number."""
        self.seq += 1
        return _Stream(conn, request_id or f"{self.seq:08d}", n, self._frame(self.CHUNK % self.seq))

    async def run(self) -> None:
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            wrote = False
            keep: list[_Stream] = []
            for s in self.streams:
                conn = s.conn
                if conn.closed:
                    continue
                if conn.paused:
                    keep.append(s)
                    continue
                wrote = True
                if not self._write(s):
                    keep.append(s)
            self.streams = keep
            if self.step_s:
                await asyncio.sleep(self.step_s)
            elif wrote:
                await asyncio.sleep(0)
            else:
                self.wake.clear()
                await self.wake.wait()


class _Conn(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: enough for two aiohttp clients, nothing more."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.buf = b""
        self.paused = False
        self.closed = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def connection_lost(self, exc) -> None:  # type: ignore[override]
        self.closed = True

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.engine.wake.set()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", 0))
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            self.handle(method, path, body, headers.get("x-request-id"))

    def _reply(self, payload: object, status: str = "200 OK") -> None:
        data = json.dumps(payload).encode()
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), len(data), data)
        )

    def handle(self, method: str, path: str, body: bytes, request_id: str | None) -> None:
        engine = self.engine
        if path == "/v1/models":
            self._reply({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif path == "/health":  # GuideLLM checks it before any load, as vLLM serves it
            self._reply({})
        elif path == "/metrics":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
        elif path == "/reset":
            config = json.loads(body or b"{}")
            engine.step_s = float(config.get("step_s", 0.0))
            engine.ttft_s = float(config.get("ttft_s", 0.0))
            engine.reset()
            self._reply({"ok": True})
        elif path == "/stats":
            self._reply(
                {
                    "chunks": engine.chunks,
                    "cpu_s": time.process_time() - engine.cpu0,
                    "requests": engine.requests,
                    "first_arrival": engine.first_arrival,
                    "last_done": engine.last_done,
                    "arrival": engine.arrival,
                    "first_write": engine.first_write,
                    "writes": engine.writes,
                    "wall_minus_perf": time.time() - time.perf_counter(),
                }
            )
        elif method == "POST" and path == "/v1/completions":
            req = json.loads(body)
            if not req.get("stream"):
                self._reply({"choices": [{"text": " tok"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
                return
            prompt = req.get("prompt")
            # The key that pairs the server's stamps with the client's: the token-id prompt's first id (servelab,
            # vLLM's client), AIPerf's X-Request-ID header, else the arrival number (GuideLLM: its response id).
            if request_id is None and isinstance(prompt, list) and prompt:
                request_id = str(prompt[0])
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            max_tokens = req.get("max_tokens") or req.get("max_completion_tokens") or 1
            engine.add(engine.stream(self, request_id, int(max_tokens)))
        else:
            self._reply({"error": {"message": f"no route {path}"}}, "404 Not Found")


async def _serve(port: int) -> None:
    engine = _Engine(0.0)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(engine), "127.0.0.1", port, backlog=1024)
    print(f"listening {port}", flush=True)
    async with server:
        await engine.run()


# --------------------------------------------------------------------------- vLLM's client


def _vllm_client(args: argparse.Namespace) -> None:
    """Runs under the vLLM venv: vLLM's own benchmark() with its own request function, timed per request."""
    from vllm.benchmarks import serve
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib import endpoint_request_func as erf

    timings: dict[int, dict] = {}
    original = erf.ASYNC_REQUEST_FUNCS["openai"]

    async def timed(request_func_input, session, pbar=None):
        out = await original(request_func_input, session, pbar)
        if out.success:
            first = out.start_time + out.ttft
            chunks = [first]
            for gap in out.itl:
                chunks.append(chunks[-1] + gap)
            timings[request_func_input.prompt[0]] = {"send": out.start_time, "chunks": chunks}
        return out

    serve.ASYNC_REQUEST_FUNCS["openai"] = timed
    requests = [
        SampleRequest(prompt=[i, 1, 2, 3], prompt_len=4, expected_output_len=args.chunks) for i in range(args.requests)
    ]
    base = f"http://127.0.0.1:{args.port}"
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = asyncio.run(
        serve.benchmark(
            task_type=serve.TaskType.GENERATION,
            endpoint_type="openai",
            api_url=base + "/v1/completions",
            base_url=base,
            model_id=MODEL,
            model_name=MODEL,
            tokenizer=None,
            input_requests=requests,
            logprobs=None,
            request_rate=float("inf"),
            burstiness=1.0,
            disable_tqdm=True,
            num_warmups=0,
            profile=False,
            selected_percentile_metrics=["ttft"],
            selected_percentiles=[99.0],
            ignore_eos=True,
            goodput_config_dict={},
            max_concurrency=args.concurrency,
            lora_modules=None,
            extra_headers=None,
            extra_body=None,
            ready_check_timeout_sec=0,
        )
    )
    out = {
        "completed": result["completed"],
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "timings": timings,
    }
    Path(args.out).write_text(json.dumps(out))


# --------------------------------------------------------------------------- orchestration


def _post(port: int, path: str, payload: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(payload or {}).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _children_cpu() -> float:
    """CPU time of this process's finished children: a client run as a subprocess, start-up and all."""
    t = os.times()
    return t.children_user + t.children_system


def _cpu_with_children() -> float:
    """This process's CPU time plus that of its finished worker processes: the whole client's cost."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _servelab_client(port: int, requests: int, chunks: int, concurrency: int, workers: int, out_dir: Path) -> dict:
    """As `servelab bench` runs a point (run_point: records to JSONL, summary, self-report), minus start-up."""
    from servelab.experiment.runner import run_point
    from servelab.schemas.results import RunInfo
    from servelab.metrics.records import MemorySink
    from servelab.targets.http import HttpTarget
    from servelab.workload.spec import LoadPlan, RequestSpec

    plan = LoadPlan([RequestSpec(i, [i, 1, 2, 3], chunks) for i in range(requests)], max_concurrency=concurrency)
    target = HttpTarget(f"http://127.0.0.1:{port}", ignore_eos=True, scrape_interval=3600, workers=workers)
    sink = MemorySink()
    cpu0, wall0 = _cpu_with_children(), time.perf_counter()
    summary = run_point(target, plan, out_dir, RunInfo.begun(), observers=[sink]).model_dump(exclude_unset=True)
    zero = summary["client_stats"]["clock_zero_perf_counter"]
    return {
        "completed": summary["completed"],
        "cpu_s": _cpu_with_children() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "timings": {
            str(r.index): {
                "send": zero + r.send_time,
                "chunks": [zero + t for t in r.chunk_times],
                "wave": r.intended_time == 0.0,
                "write": r.http_send_s,
            }
            for r in sink.records
            if r.ok and r.chunk_times
        },
        "client_stats": summary["client_stats"],
        "warnings": summary["warnings"],
    }


def _servelab_cli(port: int, requests: int, chunks: int, concurrency: int, workers: int, out_dir: Path) -> dict:
    """The `servelab bench` command as a user runs it: a fresh process, start-up included in its CPU."""
    cmd = [
        sys.executable,
        "-c",
        "from servelab.cli import main; main()",
        "bench",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--model",
        MODEL,
        "--ignore-eos",
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(requests),
        "--random-input-len",
        "4",
        "--random-output-len",
        str(chunks),
        "--length-distribution",
        "fixed",
        "--scrape-interval",
        "3600",
        "--workers",
        str(workers),
        "--result-dir",
        str(out_dir),
    ]
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out_dir / "summary.json").read_text())
    cpu = _children_cpu() - cpu0
    return {
        "completed": summary["completed"],
        "cpu_s": cpu,
        "process_cpu_s": cpu,
        "wall_s": time.perf_counter() - wall0,
        "timings": {},
        "client_stats": summary["client_stats"],
        "warnings": summary["warnings"],
    }


def _peer_run(cmd: list[str], log: Path) -> float:
    """Run a peer's command line as a fresh process; its CPU (children reaped included), or an error with its log."""
    cpu0 = _children_cpu()
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900, check=False)
    if done.returncode:
        raise RuntimeError(
            f"{cmd[0]} exited {done.returncode}; last lines of {log}:\n"
            + "".join(log.read_text().splitlines(True)[-15:])
        )
    return _children_cpu() - cpu0


def _aiperf_client(port: int, requests: int, chunks: int, concurrency: int, work: Path) -> dict:
    """AIPerf's `profile` as a user runs it (its defaults for workers and record processors). Output tokens are
    the server's usage counts (--use-server-token-count), as the server counts them, not re-tokenized text.
    Requests pair with the server's stamps by the X-Request-ID header AIPerf sends and exports."""
    art = work / "aiperf"
    cmd = [
        str(AIPERF),
        "profile",
        "--model",
        MODEL,
        "--url",
        f"http://127.0.0.1:{port}",
        "--endpoint-type",
        "completions",
        "--streaming",
        "--concurrency",
        str(concurrency),
        "--request-count",
        str(requests),
        "--tokenizer",
        str(TOKENIZER),
        "--synthetic-input-tokens-mean",
        "4",
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(chunks),
        "--output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--use-server-token-count",
        "--ui-type",
        "none",
        "--artifact-dir",
        str(art),
    ]
    wall0 = time.perf_counter()
    cpu = _peer_run(cmd, work / "aiperf.log")
    wall = time.perf_counter() - wall0
    records = [json.loads(line) for line in (art / "profile_export.jsonl").read_text().splitlines() if line.strip()]
    timings = {}
    for record in records:
        meta, metrics = record["metadata"], record.get("metrics") or {}
        if "time_to_first_token" not in metrics:
            continue
        send = meta["request_start_ns"] / 1e9  # wall clock: converted to the server's clock in _accuracy
        chunk_times = [send + metrics["time_to_first_token"]["value"] / 1e3]
        for gap_ms in (metrics.get("inter_chunk_latency") or {}).get("value") or []:
            chunk_times.append(chunk_times[-1] + gap_ms / 1e3)
        timings[meta["x_request_id"]] = {"send": send, "chunks": chunk_times, "wall_clock": True}
    return {"completed": len(timings), "cpu_s": cpu, "process_cpu_s": cpu, "wall_s": wall, "timings": timings}


def _guidellm_client(port: int, requests: int, chunks: int, concurrency: int, work: Path) -> dict:
    """GuideLLM's `run` as a user runs it, from a scenario file (GuideLLM 0.8's form). It keeps per request only
    the first and last token times and the number of token iterations, so its client-added ITL is per request
    (mean gap) rather than per gap. Requests pair with the server's stamps by the response id it records."""
    out = work / "guidellm.json"
    scenario = {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": f"http://127.0.0.1:{port}",
                "model": MODEL,
                "request_format": "/v1/completions",
            },
            "profile": {"kind": "concurrent", "streams": [concurrency]},
            "tokenizer": {"kind": "hf_auto", "model": str(TOKENIZER)},
            "data": [{"kind": "synthetic_text", "prompt_tokens": 4, "output_tokens": chunks}],
            "constraints": [{"kind": "max_requests", "count": requests}],
            "outputs": [{"kind": "json", "path": str(out)}],
        }
    }
    (work / "guidellm-scenario.json").write_text(json.dumps(scenario))
    wall0 = time.perf_counter()
    cpu = _peer_run(
        [str(GUIDELLM), "run", "-c", str(work / "guidellm-scenario.json"), "--disable-console-interactive"],
        work / "guidellm.log",
    )
    wall = time.perf_counter() - wall0
    timings = {}
    for req in json.loads(out.read_text())["benchmarks"][0]["requests"]["successful"]:
        t = req["info"]["timings"]
        if not t.get("first_token_iteration") or not req.get("response_id"):
            continue
        timings[req["response_id"].removeprefix("cmpl-")] = {
            "send": t["request_start"],
            "chunks": [t["first_token_iteration"], t["last_token_iteration"]],
            "iterations": t["token_iterations"],
            "wall_clock": True,
        }
    return {"completed": len(timings), "cpu_s": cpu, "process_cpu_s": cpu, "wall_s": wall, "timings": timings}


def _pcts(values: list[float]) -> tuple[float | None, float | None]:
    import numpy as np

    if not values:
        return None, None
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99)


def _accuracy(timings: dict[int, dict], stats: dict, concurrency: int) -> dict:
    """Client-added TTFT from the server's write stamp and from the request's arrival, client-added inter-token
    gaps against the server's own, and TTFT of the first wave against later waves (all in ms)."""
    arrival, first_write, writes = stats["arrival"], stats["first_write"], stats["writes"]
    shift = stats["wall_minus_perf"]  # peers that stamp with the wall clock: onto the server's perf_counter
    timings = {
        i: {**t, "send": t["send"] - shift, "chunks": [c - shift for c in t["chunks"]]} if t.get("wall_clock") else t
        for i, t in timings.items()
    }
    common = [i for i in timings if i in first_write and i in arrival]
    from_write = [1e3 * (timings[i]["chunks"][0] - first_write[i]) for i in common]
    from_arrival = [
        1e3 * ((timings[i]["chunks"][0] - timings[i]["send"]) - (first_write[i] - arrival[i])) for i in common
    ]
    itl = []
    for i in common:
        client, server = timings[i]["chunks"], writes.get(i, [])
        if "iterations" in timings[i] and len(server) == timings[i]["iterations"] > 1:  # GuideLLM: mean gaps only
            n = len(server) - 1
            itl.append(1e3 * ((client[-1] - client[0]) - (server[-1] - server[0])) / n)
        elif len(client) == len(server):
            itl += [1e3 * ((c1 - c0) - (s1 - s0)) for c0, c1, s0, s1 in zip(client, client[1:], server, server[1:])]
    by_send = sorted(common, key=lambda i: timings[i]["send"])
    marked = any("wave" in timings[i] for i in common)  # servelab knows; for vLLM's client, the first N sent
    wave = {i for i in common if timings[i]["wave"]} if marked else set(by_send[:concurrency])
    ttft = {i: 1e3 * (timings[i]["chunks"][0] - timings[i]["send"]) for i in common}
    row = {}
    for name, values in (
        ("added_ttft_from_write", from_write),
        ("added_ttft_from_arrival", from_arrival),
        ("added_itl", itl),
    ):
        row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = _pcts(values)
    for name, in_wave in (("wave1", True), ("later", False)):
        ids = [i for i in common if (i in wave) == in_wave]
        row[f"{name}_ttft_p50_ms"] = _pcts([ttft[i] for i in ids])[0]
        # The client's own part of the first token's delay (its read after the server's write), and the time from
        # the client's send to the server parsing the request: the client's write (servelab's http_send_s, ~10 us
        # here) plus the harness server's queue when a whole wave lands on its one event loop at once.
        row[f"{name}_added_ttft_p50_ms"] = _pcts([1e3 * (timings[i]["chunks"][0] - first_write[i]) for i in ids])[0]
        row[f"{name}_to_server_p50_ms"] = _pcts([1e3 * (arrival[i] - timings[i]["send"]) for i in ids])[0]
        writes_s = [timings[i]["write"] for i in ids if timings[i].get("write") is not None]  # servelab's only
        if writes_s:
            row[f"{name}_write_p50_ms"] = _pcts([1e3 * w for w in writes_s])[0]
    row["server_ttft_p50_ms"] = _pcts([1e3 * (first_write[i] - arrival[i]) for i in common])[0]
    return row


def _run_client(client: str, args: argparse.Namespace, requests: int, chunks: int, work: Path) -> dict:
    """One run of one client against the server as configured now."""
    work.mkdir()
    if client in ("servelab", "servelab-cli"):
        run = _servelab_client if client == "servelab" else _servelab_cli
        result = run(args.port, requests, chunks, args.concurrency, args.workers, work)
    elif client in ("aiperf", "guidellm"):
        peer = _aiperf_client if client == "aiperf" else _guidellm_client
        result = peer(args.port, requests, chunks, args.concurrency, work)
    else:
        out = work / "vllm.json"
        cmd = [
            str(VLLM_PYTHON),
            __file__,
            "vllm-client",
            "--port",
            str(args.port),
            "--out",
            str(out),
            "--requests",
            str(requests),
            "--chunks",
            str(chunks),
            "--concurrency",
            str(args.concurrency),
        ]
        cpu0 = _children_cpu()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        result = json.loads(out.read_text())
        result["process_cpu_s"] = _children_cpu() - cpu0
    return result


def _phase(name: str, client: str, args: argparse.Namespace, step_s: float, work: Path) -> dict:
    paced = step_s > 0
    config = {"step_s": step_s, "ttft_s": args.ttft_ms / 1e3 if paced else 0.0}
    requests = args.accuracy_requests if paced else args.requests
    chunks = args.accuracy_chunks if paced else args.chunks
    marginal = None
    if not paced and client != "servelab":
        # A whole process's CPU holds its start-up (imports, AIPerf's services, datasets), which a longer run
        # spreads thinner. The same command with one wave of requests measures that fixed part; the difference
        # over the difference in chunks is what each further chunk costs: comparable across every client.
        _post(args.port, "/reset", config)
        base = _run_client(client, args, args.concurrency, chunks, work / f"{client}-{name}-base")
        base_chunks = _post(args.port, "/stats")["chunks"]
    _post(args.port, "/reset", config)
    result = _run_client(client, args, requests, chunks, work / f"{client}-{name}")
    stats = _post(args.port, "/stats")
    if not paced and client != "servelab" and stats["chunks"] > base_chunks:
        marginal = 1e6 * (result["process_cpu_s"] - base["process_cpu_s"]) / (stats["chunks"] - base_chunks)
    span = stats["last_done"] - stats["first_arrival"]
    chunks_served = max(stats["chunks"], 1)
    self_report = result.get("client_stats") or {}
    row = {
        "phase": name,
        "client": client,
        "completed": result["completed"],
        "chunks_per_s": stats["chunks"] / span,
        "requests_per_s": stats["requests"] / span,
        "client_cpu_us_per_chunk": None if client in ("aiperf", "guidellm") else 1e6 * result["cpu_s"] / chunks_served,
        "process_cpu_us_per_chunk": 1e6 * result["process_cpu_s"] / chunks_served
        if "process_cpu_s" in result
        else None,
        "marginal_cpu_us_per_chunk": marginal,
        "server_cpu_us_per_chunk": 1e6 * stats["cpu_s"] / chunks_served,
        "self_report_warned": bool(self_report.get("client_may_be_bottleneck")) if self_report else None,
        "self_report_added_ms": (self_report.get("added_delay") or {}).get("mean_ms") if self_report else None,
        "warnings": result.get("warnings"),
    }
    row.update(_accuracy(result["timings"], stats, args.concurrency))
    return row


COLUMNS = [
    ("chunks/s", "chunks_per_s", ".0f"),
    ("CPU µs/chunk run", "client_cpu_us_per_chunk", ".2f"),
    ("CPU µs/chunk process", "process_cpu_us_per_chunk", ".2f"),
    ("CPU µs/chunk marginal", "marginal_cpu_us_per_chunk", ".2f"),
    ("srv CPU µs/chunk", "server_cpu_us_per_chunk", ".2f"),
    ("+TTFT write p50", "added_ttft_from_write_p50_ms", ".2f"),
    ("+TTFT write p99", "added_ttft_from_write_p99_ms", ".2f"),
    ("+TTFT arrival p50", "added_ttft_from_arrival_p50_ms", ".2f"),
    ("+TTFT arrival p99", "added_ttft_from_arrival_p99_ms", ".2f"),
    ("+ITL p50", "added_itl_p50_ms", ".2f"),
    ("+ITL p99", "added_itl_p99_ms", ".2f"),
    ("wave1 TTFT p50", "wave1_ttft_p50_ms", ".2f"),
    ("later TTFT p50", "later_ttft_p50_ms", ".2f"),
    ("wave1 +TTFT write p50", "wave1_added_ttft_p50_ms", ".2f"),
    ("later +TTFT write p50", "later_added_ttft_p50_ms", ".2f"),
    ("wave1 send→server p50", "wave1_to_server_p50_ms", ".2f"),
    ("later send→server p50", "later_to_server_p50_ms", ".2f"),
    ("wave1 write p50", "wave1_write_p50_ms", ".2f"),
    ("server TTFT p50", "server_ttft_p50_ms", ".2f"),
    ("warned", "self_report_warned", ""),
    ("self-est. ms", "self_report_added_ms", ".2f"),
]


def _markdown(rows: list[dict]) -> str:
    head = "| phase | client | done | " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for row in rows:
        cells = []
        for _, key, fmt in COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else (format(value, fmt) if fmt else str(value)))
        lines.append(f"| {row['phase']} | {row['client']} | {row['completed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="compare", choices=["compare", "server", "vllm-client"])
    parser.add_argument("--port", type=int, default=18109)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--chunks", type=int, default=128)
    parser.add_argument("--accuracy-requests", type=int, default=1024)
    parser.add_argument("--accuracy-chunks", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--ttft-ms", type=float, default=10.0, help="paced phase: the server's own TTFT per request")
    parser.add_argument("--clients", default="servelab,servelab-cli,vllm,aiperf,guidellm")
    parser.add_argument("--phases", default="capacity,accuracy")
    parser.add_argument("--workers", type=int, default=1, help="servelab client processes (HttpTarget workers)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "server":
        import uvloop  # the server must outrun both clients, or the comparison measures the server

        uvloop.run(_serve(args.port))
        return
    if args.mode == "vllm-client":
        _vllm_client(args)
        return

    server = subprocess.Popen(
        [sys.executable, __file__, "server", "--port", str(args.port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        rows: list[dict] = []
        failed: list[str] = []
        with tempfile.TemporaryDirectory(prefix="servelab-client-capacity-") as tmp:
            for client in args.clients.split(","):
                for phase in args.phases.split(","):
                    try:
                        rows.append(
                            _phase(phase, client, args, 0.0 if phase == "capacity" else args.step_ms / 1e3, Path(tmp))
                        )
                    except (OSError, RuntimeError, subprocess.SubprocessError, KeyError, ValueError) as exc:
                        failed.append(f"{phase} {client}: could not run: {type(exc).__name__}: {exc}")
    finally:
        server.terminate()
        server.wait(10)
    print(f"{os.cpu_count()} CPUs; server, clients share them. concurrency={args.concurrency}, workers={args.workers}")
    print(_markdown(rows))
    by = {(r["phase"], r["client"]): r for r in rows}
    for phase in ("capacity", "accuracy"):
        v = by.get((phase, "vllm"))
        for ours in ("servelab", "servelab-cli"):
            s = by.get((phase, ours))
            if s and v:
                key = "client_cpu_us_per_chunk" if ours == "servelab" else "process_cpu_us_per_chunk"
                print(
                    f"{phase}: vLLM / {ours} CPU per chunk: {v[key] / s[key]:.2f}x "
                    f"({'in the run' if ours == 'servelab' else 'whole processes, start-up included'}); "
                    f"chunks/s {s['chunks_per_s'] / v['chunks_per_s']:.2f}x"
                )
    for peer in ("aiperf", "guidellm"):
        for phase in ("capacity", "accuracy"):
            s, o = by.get((phase, "servelab-cli")), by.get((phase, peer))
            if s and o:
                cpu_ratio = o["process_cpu_us_per_chunk"] / s["process_cpu_us_per_chunk"]
                print(
                    f"{phase}: {peer} / servelab-cli CPU per chunk: {cpu_ratio:.2f}x "
                    f"(whole processes, start-up included); chunks/s {s['chunks_per_s'] / o['chunks_per_s']:.2f}x"
                )
    ours = by.get(("capacity", "servelab-cli"))
    for other in ("vllm", "aiperf", "guidellm"):
        theirs = by.get(("capacity", other))
        if ours and theirs and ours["marginal_cpu_us_per_chunk"] and theirs["marginal_cpu_us_per_chunk"]:
            print(
                f"capacity: {other} / servelab-cli marginal CPU per chunk (start-up taken out): "
                f"{theirs['marginal_cpu_us_per_chunk'] / ours['marginal_cpu_us_per_chunk']:.2f}x"
            )
    for line in failed:
        print(line)
    for row in rows:
        for warning in row.get("warnings") or []:
            print(f"{row['phase']} {row['client']}: {warning}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
