"""Start an inference server as a child process, wait until it serves, and stop it without leftovers.

Tests start a real vLLM this way, and `servelab tune` starts one server per
configuration it measures. Both need the same guarantees: a server that dies
while loading is reported with its own last words (the log tail), not as a
bare timeout; and stopping really stops it. vLLM forks an engine-core process
(and on some builds more), so the server is started in a process group of
its own and signalled as a whole group: SIGTERM, a grace period, then SIGKILL.

A new process group, not a new session: Linux's scheduler autogroups
processes by session, and a busy server in a session of its own starved the
load generator beside it. With the vLLM CPU server in its own session, the
client's event loop woke up to 430 ms late and whole streams arrived in one
read; in the client's session, 1-5 ms (same machine, same runs, alternated).

A server must not outlive the process that started it, even one killed with
SIGKILL, which runs no handler and no atexit. PR_SET_PDEATHSIG on the server
is not enough: it signals the group leader only, and a vLLM API server
SIGKILLed alone leaves its EngineCore and worker processes running (seen on
the CPU build). So each server gets a watchdog: a small process, in a group
of its own, that blocks reading a pipe whose only write end this process
holds. The kernel closes that end however this process ends; the watchdog
then stops the server's whole group (SIGTERM, the grace period, SIGKILL).
`stop()` writes one byte before it closes the pipe: the group is already
gone, and the watchdog leaves without signalling anything.

The watchdog is not this process's child: it forks once more and its first
process exits, so it is nobody's child here. A process that ends may take its
direct children with it, and a Ray worker does: on its way out (its node's
raylet died, or the task was cancelled with force) Ray SIGKILLs each of the
worker's child processes (CoreWorker::KillChildProcs, on by default). That
killed both the server's leader and a child watchdog, and left vLLM's
EngineCore serving with nobody to stop it (a removed node's trial, seen here
with Ray 2.58). A detached watchdog outlives that, reads EOF, and stops what
is left of the group.
"""

from __future__ import annotations

import atexit
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from servelab.errors import ServerFault

READY_PATHS = ("/health", "/v1/models")
"""What an OpenAI-compatible server answers 200 to once it can take requests."""

LOG_TAIL_LINES = 40
PROC = Path("/proc")

WATCHDOG = """
import os, signal, sys, time
if os.fork():  # detached: the first process exits, the watchdog is nobody's child (see the module docstring)
    os._exit(0)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle; this only acts when it is gone
print(os.getpid(), flush=True)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
if sys.stdin.buffer.read():  # returns at EOF; a byte before it means the parent stopped the server itself
    sys.exit(0)
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        break
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            sys.exit(0)
        time.sleep(0.1)
"""
"""The watchdog's program (see the module docstring); argv: the server's process group, the grace period. It prints
its pid once detached."""


class ServerStartError(ServerFault, RuntimeError):
    """The server exited, or never became ready, before serving; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it), for a server about to start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):  # refused, reset, timeout, HTTP error, garbage
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (one we may not signal counts as alive).

    A zombie does not count: it runs nothing, yet stays in its group until its parent reaps it, and a
    server's orphaned processes are reaped by PID 1, which in some containers never does. On Linux the
    group is read from /proc; elsewhere kill(2) answers, zombies included.
    """
    if PROC.is_dir():
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not: see group_alive); kill(2) answers where there is no /proc."""
    if PROC.is_dir():
        try:
            return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """The running (not zombie) processes of a process group, from /proc/PID/stat; [] without /proc."""
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        try:  # state and process group follow the command name's closing parenthesis
            state, _ppid, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if entry.name.isdigit() and int(group) == pgid and state != "Z":
            found.append(int(entry.name))
    return found


_live: set[ServerProcess] = set()


@atexit.register
def _stop_live_servers() -> None:
    """Last line of defence: an interpreter that exits (even on Ctrl-C) takes its servers with it."""
    for server in list(_live):
        server.stop()


class ServerProcess:
    """One server process group, started on `start()` and gone after `stop()`.

    Usable as a context manager. `base_url` is where it serves once ready;
    readiness means every path in `ready_paths` answered HTTP 200.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        host: str,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        ready_paths: Sequence[str] = READY_PATHS,
        startup_timeout: float = 300.0,
        stop_timeout: float = 20.0,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.host = host
        self.port = port
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.ready_paths = tuple(ready_paths)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self.watchdog_pid: int | None = None
        """The detached watchdog's pid while it watches (it is not this process's child: see the module docstring)."""
        self._lifeline: int | None = None
        """The write end of the watchdog's pipe; closing it (or dying) sets the watchdog off."""
        self.startup_seconds: float | None = None
        """How long `start()` took until the server was ready."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The group leader's pid (also the process-group id), or None before start."""
        return self._proc.pid if self._proc else None

    def exit_code(self) -> int | None:
        """The leader's exit status once it has exited (negative: killed by that signal); None while it runs."""
        return None if self._proc is None else self._proc.poll()

    def running(self) -> bool:
        """True while any process of the group is alive (zombies aside: see group_alive)."""
        return self._proc is not None and group_alive(self._proc.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> ServerProcess:
        """Launch and block until ready; on any failure (or Ctrl-C) the group is stopped before raising."""
        if self._proc is not None:
            raise RuntimeError("ServerProcess.start() called twice")
        if _port_in_use(self.host, self.port):
            raise ServerStartError(f"{self.host}:{self.port} is already in use; not starting {self.argv[0]}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                process_group=0,
            )
        _live.add(self)
        self._watch(self._proc.pid)
        try:
            self._wait_ready(began + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _watch(self, pgid: int) -> None:
        """Start the watchdog that stops group `pgid` once this process lets go of the pipe, however it ends."""
        read_end, self._lifeline = os.pipe()  # both ends close-on-exec: no other child holds the write end
        try:
            with subprocess.Popen(
                [sys.executable, "-c", WATCHDOG, str(pgid), str(self.stop_timeout)],
                stdin=read_end,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                process_group=0,
            ) as launcher:
                assert launcher.stdout is not None
                self.watchdog_pid = int(launcher.stdout.readline())
        finally:
            os.close(read_end)

    def _release_watchdog(self) -> None:
        """The group is gone: tell the watchdog so (one byte, then EOF) and wait (bounded) until it has left.

        It is not our child, so there is nothing to reap: its exit is watched in /proc (a zombie has left)."""
        if self._lifeline is not None:
            os.write(self._lifeline, b"0")
            os.close(self._lifeline)
            self._lifeline = None
        pid, self.watchdog_pid = self.watchdog_pid, None
        if pid is not None:
            deadline = time.monotonic() + 10.0
            while process_running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        pending = list(self.ready_paths)
        while pending:
            code = self._proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"server exited with code {code} before it was ready ({self.log_path}):\n{self.log_tail()}"
                )
            if _answers_ok(self.base_url + pending[0]):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"server not ready at {self.base_url}{pending[0]} after {self.startup_timeout:.0f} s"
                    f" ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def stop(self) -> int | None:
        """SIGTERM the whole group, wait up to stop_timeout, then SIGKILL it. Idempotent. Returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        _live.discard(self)
        pgid = proc.pid
        deadline = time.monotonic() + self.stop_timeout
        self._signal_group(pgid, signal.SIGTERM)
        while time.monotonic() < deadline and (proc.poll() is None or group_alive(pgid)):
            time.sleep(0.1)
        if proc.poll() is None or group_alive(pgid):
            self._signal_group(pgid, signal.SIGKILL)
            proc.wait()
            # SIGKILL cannot be ignored. Members still "alive" after this are zombies waiting for
            # an init that may never reap them, so the wait is bounded.
            reaped_by = time.monotonic() + 5.0
            while group_alive(pgid) and time.monotonic() < reaped_by:
                time.sleep(0.05)
        self._release_watchdog()
        return proc.returncode

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def vllm_cpu_argv(
    python: str | Path,
    model_dir: str | Path,
    *,
    port: int,
    served_model_name: str | None = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of vLLM's OpenAI server (the module, because the CPU build's `vllm` script is broken)."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    return argv + ["--host", host, "--port", str(port), *extra_args]


def vllm_cpu_env(kv_cache_gib: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the CPU build: VLLM_CPU_KVCACHE_SPACE is whole GiB (vLLM parses it with int())."""
    if int(kv_cache_gib) != kv_cache_gib or kv_cache_gib < 1:
        raise ValueError(f"kv_cache_gib must be a whole number of GiB >= 1, got {kv_cache_gib!r}")
    env = dict(os.environ if base is None else base)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    return env


def vllm_cpu_server(
    python: str | Path,
    model_dir: str | Path,
    *,
    log_path: Path,
    port: int | None = None,
    served_model_name: str | None = None,
    kv_cache_gib: int = 1,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    startup_timeout: float = 600.0,
) -> ServerProcess:
    """A not-yet-started ServerProcess for a vLLM CPU server (a free port is picked if none is given)."""
    port = free_port(host) if port is None else port
    return ServerProcess(
        vllm_cpu_argv(
            python, model_dir, port=port, served_model_name=served_model_name, host=host, extra_args=extra_args
        ),
        host=host,
        port=port,
        log_path=log_path,
        env=vllm_cpu_env(kv_cache_gib),
        startup_timeout=startup_timeout,
    )
