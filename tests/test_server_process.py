"""The server launcher against real (tiny) processes: ready, early exit, timeout, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from servelab.targets.server_process import (
    ServerProcess,
    ServerStartError,
    group_alive,
    free_port,
    vllm_cpu_argv,
    vllm_cpu_env,
    vllm_cpu_server,
)

# A server with /health and /v1/models that also forks a child which ignores
# SIGTERM, like an engine process that does not shut down cleanly: stop() must
# still leave no member of the group alive.
HEALTHY_SERVER = textwrap.dedent(
    """
    import http.server, multiprocessing, signal, sys, time

    def stubborn():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path in ("/health", "/v1/models")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            print(self.path, flush=True)

    if __name__ == "__main__":
        child = multiprocessing.get_context("fork").Process(target=stubborn)
        child.start()
        print("child", child.pid, flush=True)
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    script = tmp_path / "server.py"
    script.write_text(HEALTHY_SERVER)
    return script


def child_pid(log_path: Path) -> int:
    for line in log_path.read_text().splitlines():
        if line.startswith("child "):
            return int(line.split()[1])
    raise AssertionError(f"no child pid in {log_path}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone in every sense that matters.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_ready_then_stop_leaves_no_process(server_script: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    server = ServerProcess(
        [sys.executable, str(server_script), str(port)], host="127.0.0.1", port=port, log_path=log, stop_timeout=0.3
    )
    with server:
        assert server.base_url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(server.base_url + "/v1/models") as response:
            assert response.status == 200
        pgid, child = server.pid, child_pid(log)
        assert pid_alive(child)
        assert server.startup_seconds is not None
    assert not server.running()
    assert not group_alive(pgid)
    assert not pid_alive(child)
    assert "/health" in log.read_text()


def test_early_exit_raises_with_log_tail(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-c", "import sys; print('model dir not found: /nope'); sys.exit(3)"]
    server = ServerProcess(argv, host="127.0.0.1", port=port, log_path=tmp_path / "s.log")
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 3.*model dir not found: /nope"):
        server.start()
    assert not server.running()


def test_startup_timeout_stops_the_group(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(600)"]
    server = ServerProcess(
        argv, host="127.0.0.1", port=port, log_path=tmp_path / "s.log", startup_timeout=1.0, stop_timeout=5.0
    )
    with pytest.raises(ServerStartError, match=r"(?s)not ready.*/health.*loading weights"):
        server.start()
    assert not group_alive(server.pid)


def test_exception_inside_context_still_stops(server_script: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "s.log"
    server = ServerProcess(
        [sys.executable, str(server_script), str(port)], host="127.0.0.1", port=port, log_path=log, stop_timeout=0.3
    )
    with pytest.raises(KeyboardInterrupt):
        with server:
            child = child_pid(log)
            raise KeyboardInterrupt
    assert not group_alive(server.pid)
    assert not pid_alive(child)


def test_port_in_use_is_refused_before_launch(server_script: Path, tmp_path: Path) -> None:
    port = free_port()
    first = ServerProcess(
        [sys.executable, str(server_script), str(port)],
        host="127.0.0.1",
        port=port,
        log_path=tmp_path / "a.log",
        stop_timeout=0.3,
    )
    with first:
        second = ServerProcess([sys.executable, "-c", "pass"], host="127.0.0.1", port=port, log_path=tmp_path / "b.log")
        with pytest.raises(ServerStartError, match="already in use"):
            second.start()
        assert second.pid is None


def test_stop_is_idempotent_and_safe_before_start(tmp_path: Path) -> None:
    server = ServerProcess(
        [sys.executable, "-c", "pass"], host="127.0.0.1", port=free_port(), log_path=tmp_path / "s.log"
    )
    assert server.stop() is None
    assert server.stop() is None


def test_vllm_cpu_command_line_and_env(tmp_path: Path) -> None:
    argv = vllm_cpu_argv(
        "/venv/bin/python", "/m", port=18001, served_model_name="tiny-qwen", extra_args=["--max-num-seqs", "2"]
    )
    assert argv == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
        "--served-model-name", "tiny-qwen", "--host", "127.0.0.1", "--port", "18001", "--max-num-seqs", "2",
    ]  # fmt: skip
    assert vllm_cpu_env(2, base={"PATH": "/bin"}) == {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "2"}
    with pytest.raises(ValueError, match="whole number"):
        vllm_cpu_env(1.5)
    server = vllm_cpu_server("/venv/bin/python", "/m", log_path=tmp_path / "v.log", served_model_name="x")
    assert server.argv[server.argv.index("--port") + 1] == str(server.port)
    assert server.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def _start_owner(server_script: Path, log: Path) -> tuple[subprocess.Popen[str], int]:
    """A process that starts a server (stubborn child and all) and sleeps; returns it and the server's group."""
    port = free_port()
    parent = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from servelab.targets.server_process import ServerProcess
        server = ServerProcess([sys.executable, {str(server_script)!r}, "{port}"], host="127.0.0.1", port={port},
                               log_path=Path({str(log)!r}), stop_timeout=0.3).start()
        print(server.pid, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _children(pid: int) -> list[int]:
    """The direct children of `pid`, from /proc (what Ray's CoreWorker::KillChildProcs reads)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.parametrize("children_too", [False, True], ids=["parent", "parent-and-its-children"])
def test_a_server_dies_with_the_process_that_started_it_even_on_sigkill(
    server_script: Path, tmp_path: Path, children_too: bool
) -> None:
    """The parent is SIGKILLed (no handler, no atexit): the watchdog still stops the whole group, stubborn child
    included. `parent-and-its-children` is how a Ray worker ends when its node's raylet dies or its task is
    force-cancelled: it SIGKILLs each of its direct children first, the server's leader among them."""
    log = tmp_path / "server.log"
    proc, pgid = _start_owner(server_script, log)
    try:
        child = child_pid(log)
        assert group_alive(pgid) and pid_alive(child)
        doomed = _children(proc.pid) if children_too else []
        if children_too:
            assert pgid in doomed
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while (group_alive(pgid) or pid_alive(child)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(child) and not group_alive(pgid)
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_server_releases_its_watchdog(server_script: Path, tmp_path: Path) -> None:
    """The watchdog is detached (nobody's child here), watches while the server runs, and leaves once it is stopped."""
    port = free_port()
    server = ServerProcess(
        [sys.executable, str(server_script), str(port)],
        host="127.0.0.1",
        port=port,
        log_path=tmp_path / "s.log",
        stop_timeout=0.3,
    )
    with server:
        watchdog = server.watchdog_pid
        assert watchdog is not None and pid_alive(watchdog) and watchdog not in _children(os.getpid())
    assert not pid_alive(watchdog) and server.watchdog_pid is None
