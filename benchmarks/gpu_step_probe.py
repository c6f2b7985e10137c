"""Measure, on a GPU host, what the simulator's step model assumes: GEMM times and eager-mode decode steps.

Runs where only PyTorch, transformers and PyYAML are installed (a GPU machine lent for a short check, with
no package index): it imports nothing of servelab and reads the models' shapes from
servelab/perf/data/models.yaml. `benchmarks/gpu_step_compare.py` then sets the numbers beside the model; the two
H200 runs of 2026-12-04 are kept in benchmarks/measured/.

Three measurements, each written to the JSON as soon as it is done (a later failure loses nothing):

- `launch`: what one PyTorch operation costs the host to enqueue (no GPU wait), the unit of eager mode's
  CPU time, so another host's eager cost can be scaled by its own figure.
- `gemm`: cuBLAS bf16 GEMMs of each model's four linear layers (qkv, o, gate_up, down) at 1-8,192 tokens.
  Weights rotate over enough copies to exceed the L2 cache, as successive layers do in a forward pass.
- `eager`: a decode step of the whole model, eager against CUDA-graph replay, at several batch sizes:
  * `lean`: a decoder written as the serving engines write theirs, one kernel per operation where they have
    a fused one (RMSNorm, fused QKV and gate-up GEMMs, SiLU-and-multiply) — about 15 launches a layer;
  * `hf`: transformers' own model class (SDPA attention, dynamic cache), a real framework's Python per layer.
  Graph replay is the step's GPU time; eager minus that, when positive, is the host's launch-bound excess.

    python benchmarks/gpu_step_probe.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import yaml

MODELS = ("Qwen2.5-7B", "Llama-3.1-8B")
GEMM_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 8, 32, 64, 128)
CONTEXT = 512
L2_MULTIPLE = 4


def model_configs(repo: Path) -> dict[str, dict[str, Any]]:
    entries = yaml.safe_load((repo / "servelab/perf/data/models.yaml").read_text())
    return {e["name"]: e["config"] for e in entries if e["name"] in MODELS}


def host_facts(device: torch.device) -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
    }
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError:
        facts["transformers"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {
            "gpu": props.name,
            "sms": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "memory_bytes": props.total_memory,
        }
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
        )
        facts["nvidia_smi"] = smi.stdout.strip()
    return facts


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def launch_cost(device: torch.device, ops: int) -> dict[str, float]:
    """Host µs to enqueue one small elementwise op and one small GEMM, the GPU never waited on in between."""
    x = torch.ones(1024, device=device, dtype=torch.bfloat16)
    a = torch.ones(16, 256, device=device, dtype=torch.bfloat16)
    w = torch.ones(256, 256, device=device, dtype=torch.bfloat16)
    result: dict[str, float] = {}
    for name, op in (("add_us", lambda: x.add_(1)), ("linear_us", lambda: F.linear(a, w))):
        for _ in range(50):
            op()
        sync(device)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(ops):
                op()
            best = min(best, (time.perf_counter() - start) / ops * 1e6)
            sync(device)
        result[name] = best
    return result


def gpu_time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Mean seconds per call, timed by CUDA events around back-to-back calls (or the wall clock on a CPU)."""
    for _ in range(3):
        fn()
    sync(device)
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / repeats


def layer_gemms(cfg: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(k, n) of each linear layer: y[m, n] = x[m, k] @ W[n, k]^T."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // heads
    inter = cfg["intermediate_size"]
    return {"qkv": (h, (heads + 2 * kv) * d), "o": (heads * d, h), "gate_up": (h, 2 * inter), "down": (inter, h)}


def gemm_times(
    cfg: dict[str, Any], device: torch.device, tokens: tuple[int, ...], l2_bytes: int
) -> list[dict[str, Any]]:
    """Each GEMM timed inside a CUDA graph of at least 16 calls over the rotated weights: back-to-back Python calls
    would time a small GEMM at the host's enqueue pace (~25 us a call on the first H200 host), not the GPU's."""
    rows = []
    for name, (k, n) in layer_gemms(cfg).items():
        copies = max(2, -(-L2_MULTIPLE * l2_bytes // (k * n * 2)))
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]
        calls = copies * -(-16 // copies)
        for m in tokens:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)

            def every_weight() -> object:
                return [F.linear(x, weights[i % copies]) for i in range(calls)]

            run: Callable[[], object] = every_weight
            if device.type == "cuda":
                every_weight()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    every_weight()
                run = graph.replay
            seconds = gpu_time(run, device, repeats=5 if m <= 1024 else 2) / calls
            rows.append(
                {
                    "gemm": name,
                    "m": m,
                    "k": k,
                    "n": n,
                    "ms": seconds * 1e3,
                    "tflops": 2 * m * n * k / seconds / 1e12,
                    "weight_copies": copies,
                    "graph": device.type == "cuda",
                }
            )
    return rows


class LeanDecoder(torch.nn.Module):
    """A decode-only Llama/Qwen2 forward written the way serving engines write theirs (fused QKV and gate-up
    GEMMs, one RMSNorm kernel, one SiLU-and-multiply), over a static KV cache so a CUDA graph can hold it.

    Per layer: rms_norm, qkv GEMM (+bias for Qwen2), split, RoPE (4 ops), 2 cache writes, SDPA, o GEMM, add,
    rms_norm, gate_up GEMM, silu * mul, down GEMM, add. Attention reads the whole static cache (no mask):
    the same bytes as a context of `context` tokens.
    """

    def __init__(self, cfg: dict[str, Any], batch: int, context: int, device: torch.device) -> None:
        super().__init__()
        h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.heads, self.kv, self.d = heads, kv, h // heads
        inter, layers = cfg["intermediate_size"], cfg["num_hidden_layers"]
        bias = cfg["architectures"][0].startswith("Qwen2")
        bf = dict(device=device, dtype=torch.bfloat16)
        self.layers = [
            dict(
                n1=torch.ones(h, **bf),
                n2=torch.ones(h, **bf),
                qkv=torch.randn((heads + 2 * kv) * self.d, h, **bf) * 0.02,
                qkv_b=torch.zeros((heads + 2 * kv) * self.d, **bf) if bias else None,
                o=torch.randn(h, heads * self.d, **bf) * 0.02,
                gate_up=torch.randn(2 * inter, h, **bf) * 0.02,
                down=torch.randn(h, inter, **bf) * 0.02,
                k_cache=torch.zeros(batch, kv, context, self.d, **bf),
                v_cache=torch.zeros(batch, kv, context, self.d, **bf),
            )
            for _ in range(layers)
        ]
        self.embed = torch.randn(cfg["vocab_size"], h, **bf) * 0.02
        self.lm_head = self.embed if cfg.get("tie_word_embeddings") else torch.randn(cfg["vocab_size"], h, **bf) * 0.02
        self.norm = torch.ones(h, **bf)
        self.cos = torch.ones(batch, 1, 1, self.d, **bf)
        self.sin = torch.zeros(batch, 1, 1, self.d, **bf)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos + rotated * self.sin

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        x = F.embedding(tokens, self.embed)
        for p in self.layers:
            y = F.rms_norm(x, (x.shape[-1],), p["n1"])
            qkv = F.linear(y, p["qkv"], p["qkv_b"])
            q, k, v = qkv.split([self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
            q = self.rope(q.view(b, self.heads, 1, self.d))
            k = self.rope(k.view(b, self.kv, 1, self.d))
            p["k_cache"].index_copy_(2, self.slot, k)
            p["v_cache"].index_copy_(2, self.slot, v.view(b, self.kv, 1, self.d))
            a = F.scaled_dot_product_attention(q, p["k_cache"], p["v_cache"], enable_gqa=True)
            x = x + F.linear(a.reshape(b, self.heads * self.d), p["o"])
            y = F.rms_norm(x, (x.shape[-1],), p["n2"])
            gate, up = F.linear(y, p["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, p["down"])
        return F.linear(F.rms_norm(x, (x.shape[-1],), self.norm), self.lm_head).argmax(-1)


def step_times(forward: Callable[[], object], device: torch.device, steps: int) -> dict[str, float]:
    """Eager decode steps as an engine runs them: enqueue the forward, then wait for its sampled tokens."""
    for _ in range(3):
        forward()
    sync(device)
    enqueue, total = [], []
    for _ in range(steps):
        start = time.perf_counter()
        forward()
        enqueued = time.perf_counter()
        sync(device)
        enqueue.append(enqueued - start)
        total.append(time.perf_counter() - start)
    return {"eager_ms": sorted(total)[len(total) // 2] * 1e3, "enqueue_ms": sorted(enqueue)[len(enqueue) // 2] * 1e3}


def lean_steps(cfg: dict[str, Any], device: torch.device, batches: tuple[int, ...], steps: int) -> list[dict[str, Any]]:
    rows = []
    for batch in batches:
        model = LeanDecoder(cfg, batch, CONTEXT, device)
        tokens = torch.zeros(batch, dtype=torch.long, device=device)
        with torch.inference_mode():
            row: dict[str, Any] = {
                "impl": "lean",
                "batch": batch,
                "context": CONTEXT,
                **step_times(lambda: model(tokens), device, steps),
            }
            if device.type == "cuda":
                graph = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    model(tokens)
                torch.cuda.current_stream().wait_stream(stream)
                with torch.cuda.graph(graph):
                    model(tokens)
                row["graph_ms"] = gpu_time(graph.replay, device, repeats=steps) * 1e3
        rows.append(row)
    return rows


def hf_steps(cfg: dict[str, Any], device: torch.device, batches: tuple[int, ...], steps: int) -> list[dict[str, Any]]:
    """transformers' own model, eager (SDPA, dynamic cache), after a prefill of `CONTEXT` tokens per sequence."""
    import transformers

    config = transformers.AutoConfig.for_model(
        "qwen2" if cfg["architectures"][0].startswith("Qwen2") else "llama",
        **{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")},
    )
    config._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    torch.set_default_dtype(torch.float32)
    rows = []
    for batch in batches:
        with torch.inference_mode():
            prompt = torch.randint(0, 1000, (batch, CONTEXT), device=device)
            out = model(input_ids=prompt, use_cache=True)
            cache = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)

            def decode() -> object:
                nonlocal cache, nxt
                result = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache, nxt = result.past_key_values, result.logits[:, -1:].argmax(-1)
                return nxt

            rows.append({"impl": "hf", "batch": batch, "context": CONTEXT, **step_times(decode, device, steps)})
            try:
                rows[-1] |= profile_kernels(decode, device) or {}
            except Exception as error:  # noqa: BLE001 - the profiler is extra; the step times stand without it
                rows[-1]["profile_error"] = repr(error)
    return rows


def profile_kernels(fn: Callable[[], object], device: torch.device) -> dict[str, float] | None:
    """GPU kernels one call launches and their summed time (the GPU's busy time in an eager step)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels": len(events), "kernel_ms": sum(e.device_time for e in events) / 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="tiny sizes on whatever device: a dry run of the code")
    parser.add_argument("--stages", default="gemm,lean,hf", help="which measurements, comma-separated")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the lean eager/graph steps, models interleaved")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    repo = Path(__file__).resolve().parent.parent
    configs = model_configs(repo)
    if args.quick:
        configs = {
            name: cfg
            | {
                "num_hidden_layers": 2,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
            }
            for name, cfg in configs.items()
        }
    tokens, batches, steps = ((1, 64), (1, 4), 4) if args.quick else (GEMM_TOKENS, DECODE_BATCHES, 30)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_step_probe.json"
    result: dict[str, Any] = {"host": host_facts(device), "errors": []}

    def save() -> None:
        path.write_text(json.dumps(result, indent=1))

    l2 = int(result["host"].get("l2_bytes") or 50 * 2**20)
    stages: list[tuple[str, Callable[[], object]]] = [
        ("launch", lambda: launch_cost(device, 2000 if not args.quick else 100))
    ]
    wanted = set(args.stages.split(","))
    for name, cfg in configs.items():
        stages += [(f"gemm/{name}", lambda cfg=cfg: gemm_times(cfg, device, tokens, l2))] if "gemm" in wanted else []
    for round_ in range(args.rounds if "lean" in wanted else 0):
        suffix = f"/round{round_ + 1}" if args.rounds > 1 else ""
        stages += [
            (f"lean/{name}{suffix}", lambda cfg=cfg: lean_steps(cfg, device, batches, steps))
            for name, cfg in configs.items()
        ]
    for name, cfg in configs.items():
        stages += [(f"hf/{name}", lambda cfg=cfg: hf_steps(cfg, device, batches, steps))] if "hf" in wanted else []
    for key, run in stages:
        began = time.perf_counter()
        try:
            result[key] = run()
        except Exception:  # noqa: BLE001 - one failed measurement must not lose the others
            result["errors"].append({"stage": key, "traceback": traceback.format_exc()})
        print(f"{key}: {time.perf_counter() - began:.1f} s", flush=True)
        save()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(result, indent=1)[:6000])
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
