"""Start ``python app.py`` on the loopback interface and stop it again: what the app tests and
``talon.gpucheck.run_checks`` use to drive the real server (never bound beyond 127.0.0.1)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(proc: subprocess.Popen, port: int, log: Path, timeout: float) -> None:
    """Return once the app listens on ``port``; raise with the log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.25)
    raise TimeoutError(f"app did not open port {port} in {timeout:.0f} s:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def serve_app(env: Mapping[str, str], log: Path, timeout: float) -> Iterator[str]:
    """``python app.py`` on 127.0.0.1 with the environment ``env`` (the caller's, with its
    changes: this module reads no environment variables); yields its URL; always stops it."""
    port = free_port()
    full_env = {
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **env,
        "GRADIO_SERVER_PORT": str(port),
    }
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=full_env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for_port(proc, port, log, timeout)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
