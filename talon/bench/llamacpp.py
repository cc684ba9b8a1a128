"""llama.cpp as a peer in the same benchmark run: ``llamacpp`` (llama-server's plain decoding) and
``llamacpp-spec`` (its speculative setting, by default the best one the committed llama.cpp run
measured on this pair), on the embedded pair's own GGUF files, the same prompt ids as every other
method, greedy. Each runner starts its server once (the side environment that
``scripts/llamacpp_build.sh`` builds: ``Settings.llamacpp_bin_dir``) and stops it at
exit; without it the methods are refused with the command that builds it.

Its wall time per request is Talon's ``seconds`` (prefill and decoding); its forwards are
llama-server's: one per step, from ``draft_n`` and ``draft_n_accepted`` where it drafts.
"""

from __future__ import annotations

import atexit
import json
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from talon.atlas.llamacpp import llamacpp_policy
from talon.bench.runners import MethodSpec, Outcome
from talon.run_config import ConfigError
from talon.settings import Settings

LLAMACPP_METHODS: tuple[str, ...] = ("llamacpp", "llamacpp-spec")
BUILD_COMMAND = "bash scripts/llamacpp_build.sh"
# The setting the replay predicted fastest on the embedded Q4_K_M pair; measured, plain decoding was faster
# (docs/runs/2026-11-28-llamacpp-check.md).
BEST_SETTING: dict[str, Any] = {"type": "ngram-mod", "n_match": 24, "ngram_n_min": 48, "ngram_n_max": 64}


def server_binary() -> Path:
    """llama-server from the side environment, or a ConfigError saying how to build it."""
    binary = Settings.from_env().llamacpp_bin_dir / "llama-server"
    if not binary.is_file():
        raise ConfigError(f"llamacpp methods need llama-server ({binary} is missing): build it with {BUILD_COMMAND}, "
                          "or set TALON_LLAMACPP_BIN to a folder that holds it")
    return binary


def wait_ready(port: int, server: subprocess.Popen, seconds: float = 300) -> None:
    """Until llama-server on ``port`` answers ``/health`` (RuntimeError if it exits or never does)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"llama-server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama-server did not become ready in {seconds:.0f} s")


def complete(port: int, ids: list[int], tokens: int) -> tuple[dict[str, Any], float]:
    """One greedy ``/completion`` of prompt ``ids`` (prompt cache off): the response and its wall seconds."""
    body = {"prompt": ids, "n_predict": tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "return_tokens": True, "stream": False}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as resp:
        out = json.load(resp)
    return out, time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaCppRunner:
    """llama-server on ``target`` (and ``draft``) with ``flags``; started at the first request."""

    spec: MethodSpec
    target: Path
    draft: Path | None
    flags: list[str]
    threads: int = 2
    _server: subprocess.Popen | None = field(default=None, repr=False)
    _port: int = 0

    def start(self) -> None:
        self._port = _free_port()
        cmd = [str(server_binary()), "-m", str(self.target), "--host", "127.0.0.1", "--port", str(self._port),
               "-t", str(self.threads), "-tb", str(self.threads), "-c", "4096", "-np", "1", "--no-webui",
               "-fa", "on", *(["-md", str(self.draft)] if self.draft else []), *self.flags]
        self._server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(self.stop)
        wait_ready(self._port, self._server)

    def stop(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.terminate()
            self._server.wait(30)
        self._server = None

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        if self._server is None:
            self.start()
        out, seconds = complete(self._port, prompt_ids, max_new_tokens)
        tokens = list(out.get("tokens") or [])
        accepted = int(out.get("timings", {}).get("draft_n_accepted") or 0)
        steps = max(len(tokens) - 1 - accepted, 1)  # one a token but the prefill's and those accepted from drafts
        return Outcome(tokens, seconds, steps + 1)


def pair_gguf(target: str, draft: str | None) -> tuple[Path, Path | None]:
    """The GGUF files the benchmark's pair was converted from (the embedded pair ships them)."""
    from talon.models.cache import resolve_cache_dir
    from talon.models.embedded import source_gguf

    cache = resolve_cache_dir(None)
    files = [source_gguf(name, cache) for name in (target, draft) if name is not None]
    if any(f is None for f in files):
        raise ConfigError("llamacpp methods run the GGUF files the pair was converted from: leave --target and "
                          "--draft at the embedded pair")
    return files[0], files[1] if len(files) > 1 else None  # type: ignore[return-value]


def llamacpp_runners(methods: tuple[str, ...], target: str, draft: str | None, setting: dict[str, Any] | None = None,
                     threads: int = 2) -> list[LlamaCppRunner]:
    """The runners of the llama.cpp methods asked for, on the embedded pair's GGUF files (the server
    binary checked up front)."""
    wanted = [m for m in methods if m in LLAMACPP_METHODS]
    if not wanted:
        return []
    server_binary()
    target_file, draft_file = pair_gguf(target, draft)
    runners = []
    for method in wanted:
        if method == "llamacpp":
            runners.append(LlamaCppRunner(MethodSpec("llamacpp", "llamacpp", "llamacpp", {"flags": "plain"}),
                                          target_file, None, [], threads))
            continue
        policy = llamacpp_policy(setting or BEST_SETTING)
        spec = MethodSpec("llamacpp-spec", "llamacpp-spec", "llamacpp", {"setting": policy.label(),
                                                                         "flags": " ".join(policy.flags())})
        if policy.uses_draft_model and draft_file is None:
            raise ConfigError(f"llamacpp-spec {policy.label()} needs the draft model: pass --draft")
        runners.append(LlamaCppRunner(spec, target_file, draft_file if policy.uses_draft_model else None,
                                      policy.flags(), threads))
    return runners
