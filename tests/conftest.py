"""Session fixtures for tests against a real vLLM CPU server serving the tiny model.

Fixtures:
  vllm_python   Path of the vLLM venv's python (env SERVELAB_VLLM_PYTHON).
  tiny_model    Path of the tiny model dir (env SERVELAB_TINY_MODEL), built if missing.
  vllm_server   The default server: .base_url, .model_dir, .model_name ("tiny-qwen"),
                .log_path, .pid, .extra_args.
  launch_vllm   launch_vllm(extra_args=[], kv_cache_gib=1, **kw) -> context manager
                yielding a server like vllm_server, configured differently.

One vLLM at a time: the machine has 2 cores, and two servers would measure
each other. So `launch_vllm` stops the default server before it starts its
own, and the default one restarts on the next access to one of its
attributes (the `vllm_server` object stays valid; read `.base_url` when you
need it rather than caching it across tests). Tests that use `launch_vllm`
are moved to the end of the session so the default server starts once.

Tests marked `vllm` are skipped when the vLLM python is missing, unless
SERVELAB_REQUIRE_VLLM=1 (scripts/test sets it): then they fail loudly.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from servelab.targets.server_process import ServerProcess, ServerStartError, vllm_cpu_server
from support.make_tiny_model import SERVED_NAME, is_built

CACHE = Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))
VLLM_PYTHON = Path(os.environ.get("SERVELAB_VLLM_PYTHON", CACHE / "vllm-venv" / "bin" / "python"))
TINY_MODEL = Path(os.environ.get("SERVELAB_TINY_MODEL", CACHE / "tiny-model"))
REQUIRE_VLLM = os.environ.get("SERVELAB_REQUIRE_VLLM") == "1"
MAKE_TINY_MODEL = Path(__file__).parent / "support" / "make_tiny_model.py"
DEFAULT_ENGINE_ARGS = ("--max-model-len", "4096", "--max-num-seqs", "32")
"""Room for the bench tests' prompts and concurrency 16 without queueing."""


def _vllm_missing_reason() -> str | None:
    if VLLM_PYTHON.is_file() and os.access(VLLM_PYTHON, os.X_OK):
        return None
    return f"vLLM venv python not found at {VLLM_PYTHON} (set SERVELAB_VLLM_PYTHON, or run scripts/test)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _vllm_missing_reason()
    if reason and not REQUIRE_VLLM:
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))

    # Stable sort: custom-server tests last, so the default server starts (one to three minutes) as few times as
    # possible; among them first those that also use the default, while it still runs.
    def order(item: pytest.Item) -> tuple[bool, bool]:
        fixtures = getattr(item, "fixturenames", ())
        return "launch_vllm" in fixtures, "vllm_server" not in fixtures

    items.sort(key=order)


@dataclass(frozen=True)
class VllmServer:
    """A running vLLM: where it serves, what it serves, and where it logs."""

    base_url: str
    model_dir: Path
    model_name: str
    log_path: Path
    pid: int
    extra_args: tuple[str, ...]


@dataclass
class _VllmPool:
    """Owns the one vLLM that may run at a time."""

    python: Path
    model_dir: Path
    log_dir: Path
    _default: ServerProcess | None = None
    _starts: int = 0

    def _new(
        self,
        extra_args: Sequence[str],
        kv_cache_gib: int,
        model_dir: Path | None,
        model_name: str,
        startup_timeout: float,
    ) -> ServerProcess:
        self._starts += 1
        return vllm_cpu_server(
            self.python,
            model_dir or self.model_dir,
            log_path=self.log_dir / f"vllm-{self._starts}.log",
            served_model_name=model_name,
            kv_cache_gib=kv_cache_gib,
            extra_args=extra_args,
            startup_timeout=startup_timeout,
        )

    def _started(self, *server: object) -> ServerProcess:
        """A started server (`server`: _new's arguments); one more try when a start fails, the only retry in the suite.

        A test's own assertions are never retried: one that needs reruns is a test to fix. A server's
        start-up is another matter: it depends on a port picked free before the server binds it, and
        on a two-core host shared with other jobs. The failed start's log is kept; a second failure
        is reported with vLLM's log tail.
        """
        first = self._new(*server)
        try:
            return first.start()
        except ServerStartError as exc:
            print(f"vLLM start failed, retrying once (log {first.log_path}): {str(exc).splitlines()[0]}")
        return self._new(*server).start()

    def default(self) -> ServerProcess:
        if self._default is None or not self._default.running():
            if self._default is not None:
                self._default.stop()
            self._default = self._started(DEFAULT_ENGINE_ARGS, 1, None, SERVED_NAME, 600.0)
        return self._default

    def stop_default(self) -> None:
        if self._default is not None:
            self._default.stop()
            self._default = None

    @contextmanager
    def launch(
        self,
        extra_args: Sequence[str] = (),
        kv_cache_gib: int = 1,
        *,
        model_dir: Path | None = None,
        model_name: str = SERVED_NAME,
        startup_timeout: float = 600.0,
    ) -> Iterator[VllmServer]:
        self.stop_default()
        args = (*DEFAULT_ENGINE_ARGS, *extra_args)  # later flags win in vLLM's argparse
        process = self._started(args, kv_cache_gib, model_dir, model_name, startup_timeout)
        try:
            yield _describe(process, model_dir or self.model_dir, model_name, args)
        finally:
            process.stop()


def _describe(process: ServerProcess, model_dir: Path, model_name: str, args: Sequence[str]) -> VllmServer:
    assert process.pid is not None
    return VllmServer(process.base_url, model_dir, model_name, process.log_path, process.pid, tuple(args))


class _DefaultVllmServer:
    """The session's default server, (re)started on attribute access, so it survives launch_vllm."""

    def __init__(self, pool: _VllmPool) -> None:
        self._pool = pool

    def _current(self) -> VllmServer:
        return _describe(self._pool.default(), self._pool.model_dir, SERVED_NAME, DEFAULT_ENGINE_ARGS)

    def __getattr__(self, name: str):
        return getattr(self._current(), name)

    def __repr__(self) -> str:
        return f"<default vLLM server on {self._pool.model_dir}>"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    reason = _vllm_missing_reason()
    if reason:
        if REQUIRE_VLLM:
            pytest.fail(f"SERVELAB_REQUIRE_VLLM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return VLLM_PYTHON


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest) -> Path:
    if not is_built(TINY_MODEL, seed=0):
        python = request.getfixturevalue("vllm_python")
        done = subprocess.run([str(python), str(MAKE_TINY_MODEL), str(TINY_MODEL)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"building the tiny model failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
    return TINY_MODEL


@pytest.fixture(scope="session")
def _vllm_pool(vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_VllmPool]:
    pool = _VllmPool(vllm_python, tiny_model, tmp_path_factory.mktemp("vllm-logs"))
    yield pool
    pool.stop_default()


@pytest.fixture(scope="session")
def vllm_server(_vllm_pool: _VllmPool) -> _DefaultVllmServer:
    _vllm_pool.default()  # start now, so a broken install fails here with vLLM's log tail
    return _DefaultVllmServer(_vllm_pool)


@pytest.fixture(scope="session")
def launch_vllm(_vllm_pool: _VllmPool) -> Callable[..., AbstractContextManager[VllmServer]]:
    return _vllm_pool.launch
