"""What a /v1/chat/completions request costs vLLM's API server beside a /v1/completions one, by chat template.

`vllm bench serve --backend openai-chat` sends each prompt as one user message; the API server then
parses the message, renders the model's Jinja chat template and streams chat chunks, on its event loop.
This measures that extra with the method of benchmarks/cpu_side_costs.py (part 2: the API process pinned
to core 0, its event-loop thread's CPU from /proc schedstat, loads of 128 streams), on one vLLM CPU server
per chat template, each load sent to both endpoints with the same prompt and output lengths, each repeated.
Beside it, in one process, the template path alone as vLLM 0.11 runs it per request
(vllm/entrypoints/chat_utils.py: `resolve_chat_template_kwargs` parses the template to find its variables,
then transformers' `apply_chat_template` renders it).

The templates are the models' own, read from public copies (not shipped here; put them under
--templates-dir with these names):
  glm-4.6.jinja      zai-org/GLM-4.6 chat_template.jinja, as ggml-org/llama.cpp@afefa651447358ae477f31a0ea1b97adff04c64f
                     models/templates/GLM-4.6.jinja (the unpatched `visible_text(m.content).endswith` line that
                     llama.cpp's convert script patches in the Hugging Face file)
  deepseek-r1.jinja  deepseek-ai/DeepSeek-R1 tokenizer_config.json "chat_template", quoted in
                     ShishirPatil/gorilla@366e7db4d48f05eef580518dbb8787150b439f10
                     berkeley-function-call-leaderboard/bfcl_eval/model_handler/local_inference/deepseek_reasoning.py
                     (JSON-decoded)
  qwen3.jinja        the Qwen3 family's tokenizer_config.json "chat_template" (Qwen3-0.6B's, which Qwen3-235B-A22B
                     shares), as ye-NX/llama.cpp@b354d7c9ecb76c97c07098617cdebbdfffa2583e
                     models/templates/Qwen-Qwen3-0.6B.jinja
and `own`, the tiny model's chat_template.jinja (ChatML, one line).

Every server run holds `flock /tmp/servelab-heavy.lock` for one template at a time; every load is bounded in
count and time; only the processes started here are stopped.

    .venv/bin/python benchmarks/chat_api_costs.py --vllm-python <vLLM 0.11 venv>/bin/python \\
        --model-dir <tiny model, tokenizer_config for transformers 4.57> --templates-dir <dir> \\
        --raw benchmarks/data/chat_api_costs-0.11.0.json
    .venv/bin/python benchmarks/chat_api_costs.py ... --cached-template-vars \\
        --raw benchmarks/data/chat_api_costs-0.11.0-cached-vars.json   # also each server with 0.11.1's cache
    .venv/bin/python benchmarks/chat_api_costs.py --from-raw benchmarks/data/chat_api_costs-0.11.0.json

Measured here (2026-12-06, two passes, each load twice; 21-word prompts, 106 tokens of the tiny model's tokenizer
(117-134 once templated), 4 outputs; chat minus completions on the event loop): the tiny model's template
+1.0..1.3 ms, GLM-4.6's +11.8..13.4, DeepSeek-R1's +13.2..17.3, Qwen3's +13.7..14.5; with the template's
variables cached +0.0..0.4 ms for every template. A chat chunk costs what a completions chunk does (59-93 us
each, token work included, where the 64-token streams were not merged).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_side_costs import (  # noqa: E402
    CACHE,
    CAPACITY_CONCURRENCY,
    WORDS_PER_128_TOKENS,
    ApiProbe,
    capacity_row,
    heavy_lock,
)

TEMPLATES = ("own", "glm-4.6", "deepseek-r1", "qwen3")
LOADS = (
    # (output tokens, requests per load)
    (4, 1200),
    (64, 500),
)
REPEATS = 2
TEMPLATE_CALLS = 300
CACHED_VARS_PATCH = """
import importlib.abc, importlib.util, sys
from functools import lru_cache


def _patch(chat_utils):
    import jinja2.ext, jinja2.meta, jinja2.sandbox

    @lru_cache
    def template_vars(chat_template):
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[chat_utils.AssistantTracker, jinja2.ext.loopcontrols]
        )
        return jinja2.meta.find_undeclared_variables(env.parse(chat_template))

    def resolve_chat_template_kwargs(tokenizer, chat_template, chat_template_kwargs):
        fn_kw = {
            k for k in chat_template_kwargs
            if chat_utils.supports_kw(tokenizer.apply_chat_template, k, allow_var_kwargs=False)
        }
        accept = (fn_kw | template_vars(chat_template)) - {"chat_template"}
        return {k: v for k, v in chat_template_kwargs.items() if k in accept}

    chat_utils.resolve_chat_template_kwargs = resolve_chat_template_kwargs


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.entrypoints.chat_utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
"""
"""A sitecustomize for vLLM 0.11.0's server: `resolve_chat_template_kwargs` with the template's variables cached
per template string, as vLLM 0.11.1 has it (`_cached_resolve_chat_template_kwargs`); everything else unchanged."""


def template_worker(model_dir: str, templates: dict[str, str]) -> None:
    """Under vLLM's venv: the per-request template path's thread CPU, median of TEMPLATE_CALLS calls (seconds).

    `resolve_kwargs_s` is vLLM 0.11's `resolve_chat_template_kwargs` (a new sandboxed Jinja environment, a parse
    of the whole template, its undeclared variables), `render_s` transformers' render with its cached compiled
    template, `parse_alone_s` the Jinja parse by itself in an environment made once."""
    import jinja2.sandbox
    from transformers import AutoTokenizer
    from vllm.entrypoints.chat_utils import resolve_chat_template_kwargs

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = " ".join(f"w{i * 7919 % 100000}" for i in range(WORDS_PER_128_TOKENS))
    conversation = [{"role": "user", "content": prompt}]
    out = {}
    for name, template in templates.items():
        kwargs = dict(
            chat_template=template, add_generation_prompt=True, continue_final_message=False, tools=None, documents=None
        )
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        kwargs_s, render_s, parse_s = [], [], []
        for _ in range(TEMPLATE_CALLS):
            tp = time.thread_time()
            env.parse(template)
            parse_s.append(time.thread_time() - tp)
            t0 = time.thread_time()
            resolved = resolve_chat_template_kwargs(
                tokenizer=tokenizer, chat_template=template, chat_template_kwargs=kwargs
            )
            t1 = time.thread_time()
            text = tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=False, **resolved)
            t2 = time.thread_time()
            kwargs_s.append(t1 - t0)
            render_s.append(t2 - t1)
        out[name] = {
            "template_chars": len(template),
            "resolve_kwargs_s": statistics.median(kwargs_s[20:]),
            "render_s": statistics.median(render_s[20:]),
            "parse_alone_s": statistics.median(parse_s[20:]),
            "rendered_chars": len(text),
        }
    print(json.dumps(out))


def measure_templates(vllm_python: Path, model_dir: Path, templates: dict[str, str]) -> dict:
    proc = subprocess.run(
        [str(vllm_python), __file__, "--template-worker", str(model_dir)],
        input=json.dumps(templates),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"template worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextmanager
def cached_template_vars():
    """The servers started inside run with CACHED_VARS_PATCH (their environment is copied from os.environ)."""
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "sitecustomize.py").write_text(CACHED_VARS_PATCH)
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = site
        try:
            yield
        finally:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before


def measure_server(
    vllm_python: Path, model_dir: Path, template: Path | None, deadline_s: float, cached_vars: bool = False
) -> list[dict]:
    """One server with `template` as its chat template; each load to both endpoints, REPEATS times (rows)."""
    extra = ["--chat-template", str(template)] if template else []
    log = Path("/tmp") / f"chat-api-costs-{os.getpid()}.log"
    rows = []
    with (
        cached_template_vars() if cached_vars else nullcontext(),
        ApiProbe(vllm_python, model_dir, log, extra_server_args=extra) as probe,
    ):
        t0 = time.monotonic()
        for chat in (False, True):  # warm-up: first requests compile and fill caches
            probe.load(WORDS_PER_128_TOKENS, 4, True, 64, 16, deadline_s, chat=chat)
        for repeat in range(REPEATS):
            for out, n in LOADS:
                for chat in (False, True):
                    res = probe.load(WORDS_PER_128_TOKENS, out, True, n, CAPACITY_CONCURRENCY, deadline_s, chat=chat)
                    name = f"{'chat' if chat else 'completions'} 128/{out}"
                    row = capacity_row(name, True, CAPACITY_CONCURRENCY, res, probe.api_pid)
                    rows.append({**row, "chat": chat, "repeat": repeat})
                    print(
                        f"  {name} #{repeat}: {row['requests_per_s']:.1f} req/s, {row['chunks_per_request']:.2f} "
                        f"chunks/req, {row['prompt_tokens']:.1f} prompt tokens, loop busy "
                        f"{row['api_main_thread_busy']:.2f}, {1e3 * row['api_main_thread_s_per_request']:.3f} ms "
                        f"loop / {1e3 * row['api_all_threads_s_per_request']:.3f} ms all threads per request",
                        file=sys.stderr,
                        flush=True,
                    )
                    if time.monotonic() - t0 > deadline_s:
                        raise SystemExit("chat API measurement ran past its time limit")
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per endpoint and output length: the loop's ms per request (each repeat), and per chunk between the lengths.

    Per chunk is the slope between the 4- and 64-token loads, (loop s/request at 64 - at 4) / (chunks at 64 - at
    4): it holds the per-token work too, as cpu_side_costs.py's per_output_token_s does. The chat extra per
    request is chat minus completions at the same output length, the chunk difference included (a chat
    stream's first chunk carries only the role).
    """
    out: dict = {}
    for endpoint in ("completions", "chat"):
        by_out = {}
        for n_out, _ in LOADS:
            sel = [r for r in rows if r["scenario"] == f"{endpoint} 128/{n_out}"]
            loop = [1e3 * r["api_main_thread_s_per_request"] for r in sel]
            by_out[n_out] = {
                "loop_ms_per_request": [round(x, 3) for x in loop],
                "mean_loop_ms_per_request": statistics.mean(loop),
                "all_threads_ms_per_request": statistics.mean(1e3 * r["api_all_threads_s_per_request"] for r in sel),
                "chunks_per_request": statistics.mean(r["chunks_per_request"] for r in sel),
                "prompt_tokens": statistics.mean(r["prompt_tokens"] for r in sel),
                "requests_per_s": statistics.mean(r["requests_per_s"] for r in sel),
            }
        lo, hi = by_out[LOADS[0][0]], by_out[LOADS[-1][0]]
        slope = (hi["mean_loop_ms_per_request"] - lo["mean_loop_ms_per_request"]) / (
            hi["chunks_per_request"] - lo["chunks_per_request"]
        )
        out[endpoint] = {"loads": by_out, "loop_ms_per_chunk": slope}
    out["chat_extra_loop_ms_per_request"] = {
        n_out: out["chat"]["loads"][n_out]["mean_loop_ms_per_request"]
        - out["completions"]["loads"][n_out]["mean_loop_ms_per_request"]
        for n_out, _ in LOADS
    }
    return out


def report(raw: dict) -> dict:
    """Print and return each template's summary."""
    summary = {name: summarize(rows) for name, rows in raw["servers"].items()}
    for name, s in summary.items():
        t = raw["templates"].get(name.split(" (")[0], {})
        extra = ", ".join(f"{k}-token {v:.3f} ms" for k, v in s["chat_extra_loop_ms_per_request"].items())
        alone = 1e3 * (t.get("resolve_kwargs_s", float("nan")) + t.get("render_s", float("nan")))
        print(
            f"{name}: chat extra per request {extra}; per chunk completions "
            f"{1e3 * s['completions']['loop_ms_per_chunk']:.0f} us, "
            f"chat {1e3 * s['chat']['loop_ms_per_chunk']:.0f} us; "
            f"0.11.0's template path alone {alone:.3f} ms",
            file=sys.stderr,
        )
    return summary


def read_templates(model_dir: Path, templates_dir: Path) -> dict[str, str]:
    texts = {"own": (model_dir / "chat_template.jinja").read_text()}
    for name in TEMPLATES[1:]:
        texts[name] = (templates_dir / f"{name}.jinja").read_text()
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template-worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--vllm-python", type=Path, default=CACHE / "vllm-0.11-venv" / "bin" / "python")
    ap.add_argument("--model-dir", type=Path, default=CACHE / "tiny-model")
    ap.add_argument("--templates-dir", type=Path, default=CACHE / "chat-templates")
    ap.add_argument("--only", nargs="*", choices=TEMPLATES, help="measure these templates only")
    ap.add_argument(
        "--cached-template-vars",
        action="store_true",
        help="also measure each server with vLLM 0.11.1's cache of the template's variables (CACHED_VARS_PATCH)",
    )
    ap.add_argument("--deadline", type=float, default=900.0, help="time limit of each server's loads, seconds")
    ap.add_argument("--raw", type=Path, help="write the measurements and their summary as JSON here")
    ap.add_argument("--from-raw", type=Path, help="only summarize measurements written by --raw")
    args = ap.parse_args()
    if args.template_worker:
        template_worker(args.template_worker, json.loads(sys.stdin.read()))
        return
    if args.from_raw:
        report(json.loads(args.from_raw.read_text()))
        return
    texts = read_templates(args.model_dir, args.templates_dir)
    raw: dict = {"vllm_python": str(args.vllm_python), "servers": {}}
    for name in args.only or TEMPLATES:
        path = None if name == "own" else args.templates_dir / f"{name}.jinja"
        for cached in (False, True) if args.cached_template_vars else (False,):
            with heavy_lock():
                if not raw.get("templates"):
                    raw["templates"] = measure_templates(args.vllm_python, args.model_dir, texts)
                key = f"{name} (template variables cached)" if cached else name
                print(f"server with the {key} chat template", file=sys.stderr, flush=True)
                raw["servers"][key] = measure_server(args.vllm_python, args.model_dir, path, args.deadline, cached)
    raw["summary"] = report(raw)
    raw["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.raw:
        args.raw.write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
