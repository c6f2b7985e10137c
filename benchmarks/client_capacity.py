"""How fast and how accurate is servelab's streaming client, against vLLM's own, in one run.

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

Two phases per client:
  capacity  closed loop at --concurrency streams, unpaced server: chunks/s and
            requests/s as measured by the server (same yardstick for both clients)
  accuracy  --concurrency streams, server paced at --step-ms per step (an
            engine producing one token per stream per step): client-added TTFT

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
import time
import urllib.request
from pathlib import Path

VLLM_PYTHON = Path.home() / ".cache/servelab/vllm-venv/bin/python"
MODEL = "bench-model"

# --------------------------------------------------------------------------- server


class _Stream:
    __slots__ = ("conn", "req_id", "n", "sent")

    def __init__(self, conn: _Conn, req_id: int, n: int) -> None:
        self.conn, self.req_id, self.n, self.sent = conn, req_id, n, 0


class _Engine:
    """Writes one chunk per open stream per step, as fast as the sockets accept them."""

    CHUNK = (
        b'data: {"id":"cmpl-1","object":"text_completion","model":"bench-model",'
        b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
    )

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.streams: list[_Stream] = []
        self.wake = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        self.chunks = 0
        self.requests = 0
        self.cpu0 = time.process_time()
        self.first_arrival: float | None = None
        self.last_done = 0.0
        self.first_write: dict[int, float] = {}

    def add(self, stream: _Stream) -> None:
        if self.first_arrival is None:
            self.first_arrival = time.perf_counter()
        self.streams.append(stream)
        self.wake.set()

    @staticmethod
    def _frame(payload: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    async def run(self) -> None:
        chunk = self._frame(self.CHUNK)
        clock = time.perf_counter
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
                if s.sent == 0:
                    self.first_write[s.req_id] = clock()
                conn.transport.write(chunk)
                s.sent += 1
                self.chunks += 1
                wrote = True
                if s.sent >= s.n:
                    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\n' % s.n
                    conn.transport.write(self._frame(usage) + self._frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    self.requests += 1
                    self.last_done = clock()
                else:
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
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            self.handle(method, path, body)

    def _reply(self, payload: object, status: str = "200 OK") -> None:
        data = json.dumps(payload).encode()
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), len(data), data)
        )

    def handle(self, method: str, path: str, body: bytes) -> None:
        engine = self.engine
        if path == "/v1/models":
            self._reply({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif path == "/metrics":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
        elif path == "/reset":
            engine.step_s = float(json.loads(body or b"{}").get("step_s", 0.0))
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
                    "first_write": engine.first_write,
                }
            )
        elif method == "POST" and path == "/v1/completions":
            req = json.loads(body)
            if not req.get("stream"):
                self._reply({"choices": [{"text": " tok"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
                return
            prompt = req.get("prompt")
            req_id = prompt[0] if isinstance(prompt, list) and prompt else -1
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            engine.add(_Stream(self, int(req_id), int(req.get("max_tokens") or 1)))
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

    firsts: dict[int, float] = {}
    original = erf.ASYNC_REQUEST_FUNCS["openai"]

    async def timed(request_func_input, session, pbar=None):
        out = await original(request_func_input, session, pbar)
        if out.success:
            firsts[request_func_input.prompt[0]] = out.start_time + out.ttft
        return out

    serve.ASYNC_REQUEST_FUNCS["openai"] = timed
    requests = [SampleRequest(prompt=[i, 1, 2, 3], prompt_len=4, expected_output_len=args.chunks) for i in range(args.requests)]
    base = f"http://127.0.0.1:{args.port}"
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = asyncio.run(
        serve.benchmark(
            task_type=serve.TaskType.GENERATION, endpoint_type="openai", api_url=base + "/v1/completions",
            base_url=base, model_id=MODEL, model_name=MODEL, tokenizer=None, input_requests=requests,
            logprobs=None, request_rate=float("inf"), burstiness=1.0, disable_tqdm=True, num_warmups=0,
            profile=False, selected_percentile_metrics=["ttft"], selected_percentiles=[99.0], ignore_eos=True,
            goodput_config_dict={}, max_concurrency=args.concurrency, lora_modules=None, extra_headers=None,
            extra_body=None, ready_check_timeout_sec=0,
        )
    )
    out = {
        "completed": result["completed"],
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "first_token": firsts,
    }
    Path(args.out).write_text(json.dumps(out))


# --------------------------------------------------------------------------- orchestration


def _post(port: int, path: str, payload: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(payload or {}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _cpu_with_children() -> float:
    """This process's CPU time plus that of its finished worker processes: the whole client's cost."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _servelab_client(port: int, requests: int, chunks: int, concurrency: int, workers: int) -> dict:
    from servelab.metrics.records import MemorySink
    from servelab.targets.http import HttpTarget
    from servelab.workload.spec import LoadPlan, RequestSpec

    plan = LoadPlan([RequestSpec(i, [i, 1, 2, 3], chunks) for i in range(requests)], max_concurrency=concurrency)
    target = HttpTarget(f"http://127.0.0.1:{port}", ignore_eos=True, scrape_interval=3600, workers=workers)
    sink = MemorySink()
    cpu0, wall0 = _cpu_with_children(), time.perf_counter()
    run = target.run(plan, sink)
    zero = run.client_stats["clock_zero_perf_counter"]
    return {
        "completed": sum(r.ok for r in sink.records),
        "cpu_s": _cpu_with_children() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "first_token": {r.index: zero + r.first_token_time for r in sink.records if r.first_token_time is not None},
        "client_stats": run.client_stats,
    }


def _phase(name: str, client: str, args: argparse.Namespace, step_s: float) -> dict:
    import numpy as np

    _post(args.port, "/reset", {"step_s": step_s})
    requests = args.requests if step_s == 0 else args.accuracy_requests
    chunks = args.chunks if step_s == 0 else args.accuracy_chunks
    if client == "servelab":
        result = _servelab_client(args.port, requests, chunks, args.concurrency, args.workers)
    else:
        out = Path(f"/tmp/servelab-bench-vllm-{os.getpid()}.json")
        cmd = [str(VLLM_PYTHON), __file__, "vllm-client", "--port", str(args.port), "--out", str(out),
               "--requests", str(requests), "--chunks", str(chunks), "--concurrency", str(args.concurrency)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        result = json.loads(out.read_text())
        out.unlink()
        result["first_token"] = {int(k): v for k, v in result["first_token"].items()}
    stats = _post(args.port, "/stats")
    span = stats["last_done"] - stats["first_arrival"]
    firsts = {int(k): v for k, v in stats["first_write"].items()}
    errors_ms = np.array([(t - firsts[i]) * 1e3 for i, t in result["first_token"].items() if i in firsts])
    return {
        "phase": name,
        "client": client,
        "completed": result["completed"],
        "chunks_per_s": stats["chunks"] / span,
        "requests_per_s": stats["requests"] / span,
        "client_cpu_us_per_chunk": 1e6 * result["cpu_s"] / max(stats["chunks"], 1),
        "server_cpu_us_per_chunk": 1e6 * stats["cpu_s"] / max(stats["chunks"], 1),
        "ttft_error_p50_ms": float(np.percentile(errors_ms, 50)) if errors_ms.size else None,
        "ttft_error_p99_ms": float(np.percentile(errors_ms, 99)) if errors_ms.size else None,
    }


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
    parser.add_argument("--clients", default="servelab,vllm")
    parser.add_argument("--workers", type=int, default=2, help="servelab client processes (HttpTarget workers)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "server":
        import uvloop  # the server must outrun both clients, or the comparison measures the server

        uvloop.run(_serve(args.port))
        return
    if args.mode == "vllm-client":
        _vllm_client(args)
        return

    server = subprocess.Popen([sys.executable, __file__, "server", "--port", str(args.port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()
        rows = []
        for client in args.clients.split(","):
            rows.append(_phase("capacity", client, args, 0.0))
            rows.append(_phase("accuracy", client, args, args.step_ms / 1e3))
    finally:
        server.terminate()
        server.wait(10)
    print(f"{os.cpu_count()} CPUs; server, clients share them. concurrency={args.concurrency}")
    keys = ["chunks_per_s", "requests_per_s", "client_cpu_us_per_chunk", "server_cpu_us_per_chunk",
            "ttft_error_p50_ms", "ttft_error_p99_ms"]
    print(f"{'phase':9} {'client':9} {'done':>5} " + " ".join(f"{k:>23}" for k in keys))
    for row in rows:
        vals = " ".join(f"{row[k]:>23.2f}" if row[k] is not None else f"{'-':>23}" for k in keys)
        print(f"{row['phase']:9} {row['client']:9} {row['completed']:>5} {vals}")
    by = {(r["phase"], r["client"]): r for r in rows}
    if ("capacity", "servelab") in by and ("capacity", "vllm") in by:
        s, v = by[("capacity", "servelab")], by[("capacity", "vllm")]
        print(f"servelab / vLLM chunks/s: {s['chunks_per_s'] / v['chunks_per_s']:.2f}x; "
              f"requests/s: {s['requests_per_s'] / v['requests_per_s']:.2f}x; "
              f"CPU per chunk: {v['client_cpu_us_per_chunk'] / s['client_cpu_us_per_chunk']:.2f}x less")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
