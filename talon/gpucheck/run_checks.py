"""The GPU check's once-per-run checks: the Hub loader on an offline snapshot, the app on this
device, a preset switch through the app's own loader, and a ZeroGPU-mode start with the real
``spaces`` package (``talon/gpucheck/check.py`` runs them)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.server
import os
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerFast,
)

import talon.server.pair as pair
from talon.engine.engine import Engine, generate
from talon.gpucheck.launch import serve_app
from talon.gpucheck.pair_checks import (
    greedy_cfg,
)
from talon.gpucheck.pairs import (
    F32,
    HUB_DRAFT,
    HUB_TARGET,
    CheckOutcome,
    PairSpec,
    Skipped,
    byte_tokenizer,
    pair_specs,
    prompt_ids,
    random_model,
    reference,
)
from talon.models import LoadedModel, ModelLoadError, load_pair
from talon.models.memory import GIB
from talon.server.presets import ModelPreset
from talon.settings import Settings

# ------------------------------------------------------------------------------------ once per run


def write_snapshot(cache: Path, repo_id: str, lm: LoadedModel, tokenizer: PreTrainedTokenizerFast) -> Path:
    """``lm`` saved as the Hub cache holds a download: models--<org>--<name>/snapshots/<commit>/,
    with refs/main naming the commit."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    lm.model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


HUB_SWITCHES = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")


@contextlib.contextmanager
def offline_hub(home: Path) -> Iterator[Path]:
    """The Hub offline, its cache in ``home``/hub, then everything as it was. huggingface_hub
    reads these variables once, at import, into ``huggingface_hub.constants`` (which
    transformers reads on every call), so the constants are switched with the environment."""
    from huggingface_hub import constants

    values = {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}
    saved_env = {k: os.environ.get(k) for k in HUB_SWITCHES}
    saved_constants = {k: getattr(constants, k) for k in HUB_SWITCHES}
    os.environ.update(values)
    for k in HUB_SWITCHES:
        setattr(constants, k, True if k == "HF_HUB_OFFLINE" else values[k])
    try:
        yield home / "hub"
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in saved_constants.items():
            setattr(constants, k, v)


def hub_snapshot_check(spec: PairSpec, device: torch.device) -> CheckOutcome:
    """``load_pair`` on two Hub ids found only in a local offline cache (the tiny shapes: this
    is about the loader's path, not the size), then a greedy run that must equal the loaded
    target's ``generate(do_sample=False)``, on weights equal to those saved."""
    tiny = pair_specs(True, {spec.key})[0]
    saved = {HUB_TARGET: random_model(tiny.target, tiny.family, 41, F32, torch.device("cpu")),
             HUB_DRAFT: random_model(tiny.draft, tiny.family, 42, F32, torch.device("cpu"))}
    env_before = {k: os.environ.get(k) for k in HUB_SWITCHES}
    ids, n = prompt_ids(tiny.draft.vocab, 24, 43), 16
    with tempfile.TemporaryDirectory(prefix="talon-hub-check-") as root, offline_hub(Path(root)) as cache:
        for repo_id, lm in saved.items():
            write_snapshot(cache, repo_id, lm, byte_tokenizer(tiny.target.vocab))
        # the loader's path, not the CPU's weight layout: the weights must come back as saved
        target, draft = load_pair(HUB_TARGET, HUB_DRAFT, dtype="float32", device=device.type, prepack=False)
        got = generate(Engine(target, draft), ids, greedy_cfg("hybrid", n))[0].token_ids
        want = reference(target, ids, n)
    pairs = ((target, saved[HUB_TARGET]), (draft, saved[HUB_DRAFT]))
    same_weights = all(torch.equal(a.cpu(), b) for got_lm, saved_lm in pairs
                       for a, b in zip(got_lm.model.state_dict().values(), saved_lm.model.state_dict().values()))
    restored = {k: os.environ.get(k) for k in HUB_SWITCHES} == env_before
    ok = got == want and len(got) == n and same_weights and restored and target.name == HUB_TARGET
    return ok, {"loaded": [target.name, draft.name if draft else None], "device": str(target.device),
                "same_tokens_as_generate": got == want, "weights_as_saved": same_weights,
                "environment_restored": restored}


def save_pair(root: Path, spec: PairSpec, seeds: tuple[int, int]) -> tuple[Path, Path]:
    """A random target and draft of ``spec``'s tiny shapes saved as local checkpoints under ``root``
    (the app and loader checks are about paths, not sizes: tiny weights load in a second)."""
    tiny = pair_specs(True, {spec.key})[0]
    dirs = []
    for name, shape, seed in (("target", tiny.target, seeds[0]), ("draft", tiny.draft, seeds[1])):
        lm = random_model(shape, tiny.family, seed, torch.float32, torch.device("cpu"))
        lm.model.save_pretrained(root / name)
        byte_tokenizer(max(tiny.target.vocab, tiny.draft.vocab)).save_pretrained(root / name)
        dirs.append(root / name)
    return dirs[0], dirs[1]


def app_on(target_dir: Path, draft_dir: Path, device: torch.device, timeout: float = 180.0, **env: str):
    """``app.py`` on 127.0.0.1 serving the saved pair on ``device`` (``env``: more variables)."""
    env = {**os.environ, "TALON_TARGET": str(target_dir), "TALON_DRAFT": str(draft_dir), "TALON_DEVICE": device.type,
           "TALON_DTYPE": "float32", "TALON_CACHE": str(target_dir.parent / "cache"), **env}
    return serve_app(env, target_dir.parent / "app.log", timeout)


def app_check(spec: PairSpec, device: torch.device) -> CheckOutcome:
    try:
        from gradio_client import Client
    except ImportError:
        raise Skipped("gradio_client is not installed") from None
    with tempfile.TemporaryDirectory(prefix="talon-gpu-check-") as root:
        target_dir, draft_dir = save_pair(Path(root), spec, (21, 22))
        with app_on(target_dir, draft_dir, device) as url:
            client = Client(url, verbose=False, download_files=root)
            job = client.submit("abc abc abc abc", max_new_tokens=24, api_name="/generate")
            outputs = list(job)
            final = job.result()
    figures = sum(isinstance(v, dict) and v.get("type") == "plotly" for v in final)
    ok = len(outputs) >= 2 and figures >= 5 and "MAT" in str(final)
    return ok, {"streamed_updates": len(outputs), "figures": figures}


@contextlib.contextmanager
def recording_slot() -> Iterator[dict[str, list]]:
    """The backend's pair slot, for the duration, replaced by a fresh one whose loads, releases
    and free-memory readings (what the guard sees) are recorded in order."""
    seen: dict[str, list] = {"events": [], "free": []}

    def build(key: Any) -> Engine:
        seen["events"].append(f"load {Path(key.target).parent.name}")
        return pair.build_engine(key)

    def release() -> None:
        seen["events"].append("release")
        pair.release_memory()

    def free(device: str) -> int | None:
        seen["free"].append(pair.free_device_bytes(device))
        return seen["free"][-1]

    held = pair.SLOT
    pair.SLOT = pair.PairSlot(build, release, free)
    try:
        yield seen
    finally:
        pair.SLOT.drop()
        pair.SLOT = held


def preset_switch_check(spec: PairSpec, device: torch.device) -> CheckOutcome:
    """The app's own loader switching presets on this device: pair A, then B (A is released before
    the guard reads the free memory, and only B is held after), then a preset that cannot load
    (the server is back on B, and B still decodes as its own ``generate``)."""
    with tempfile.TemporaryDirectory(prefix="talon-switch-check-") as root, recording_slot() as seen:
        dirs = {name: save_pair(Path(root) / name, spec, seeds) for name, seeds in (("A", (51, 52)), ("B", (53, 54)))}
        settings = dataclasses.replace(Settings.from_env(), target=str(dirs["A"][0]), draft=str(dirs["A"][1]),
                                       device=device.type, dtype="float32")
        cuda = device.type == "cuda"
        presets = {name: ModelPreset(key=f"check-{name}", label=name, target=str(t), draft=str(d), needs_cuda=cuda)
                   for name, (t, d) in dirs.items()}
        presets["C"] = dataclasses.replace(presets["B"], key="check-C", target=str(Path(root) / "C" / "target"))
        bytes_held = {}
        for name in ("A", "B"):
            pair.load_engine(settings, presets[name])
            bytes_held[name] = torch.cuda.memory_allocated(device) if cuda else None
        try:
            pair.load_engine(settings, presets["C"])
            refused = ""
        except ModelLoadError as error:
            refused = str(error)
        engine = pair.SLOT.held.engine if pair.SLOT.held is not None else None
        ids = prompt_ids(pair_specs(True, {spec.key})[0].draft.vocab, 24, 55)
        decodes = engine is not None and generate(engine, ids, greedy_cfg("hybrid", 12))[0].token_ids == reference(
            engine.target, ids, 12)
    order = seen["events"][:3] == ["load A", "release", "load B"]
    released_first = not cuda or seen["free"][1] >= seen["free"][0] - 64 * 2**20  # B's guard saw A's bytes free
    only_b = not cuda or bytes_held["B"] <= 1.1 * bytes_held["A"]
    ok = order and released_first and only_b and "back on" in refused and str(dirs["B"][0]) in refused and decodes
    return ok, {"events": seen["events"], "guard_saw_free_gib": [None if f is None else round(f / GIB, 2)
                                                                  for f in seen["free"]],
                "allocated_gib": {k: None if v is None else round(v / GIB, 3) for k, v in bytes_held.items()},
                "failed_load_says": refused[-200:], "held_pair_decodes": decodes}


class StartupReport(http.server.BaseHTTPRequestHandler):
    """A stand-in for ZeroGPU's device API: the start-up report is all a start asks of it."""

    received: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        StartupReport.received.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def zerogpu_start_check(spec: PairSpec, device: torch.device) -> CheckOutcome:
    """``app.py`` started in ZeroGPU mode by the real ``spaces`` package (SPACES_ZERO_GPU, a local
    stand-in for its device API): the start-up pair loads on the main thread as ZeroGPU records
    it, the tensors are packed and reported at launch, and the page serves. A GPU call itself
    needs ZeroGPU's scheduler and is not run here."""
    try:
        import spaces  # noqa: F401
    except ImportError:
        raise Skipped("the spaces package is not installed (pip install -r requirements-dev.txt)") from None
    if torch.version.cuda is None:
        raise Skipped("spaces cannot enter ZeroGPU mode with a CPU build of torch")
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StartupReport)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    StartupReport.received.clear()
    try:
        with tempfile.TemporaryDirectory(prefix="talon-zerogpu-check-") as root:
            target_dir, draft_dir = save_pair(Path(root), spec, (61, 62))
            env = {"SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": f"http://127.0.0.1:{api.server_port}",
                   "ZEROGPU_OFFLOAD_DIR": str(Path(root) / "offload"), "TALON_ZEROGPU_UNSUPPORTED_OK": "1"}
            with app_on(target_dir, draft_dir, torch.device("cuda"), **env) as url:
                page = urllib.request.urlopen(url, timeout=30).read().decode("utf-8", "replace")
            log = (Path(root) / "app.log").read_text()
    finally:
        api.shutdown()
    loaded = "holding" in log and "could not pre-load" not in log
    ok = loaded and "/startup-report" in StartupReport.received and "ZeroGPU" in page
    return ok, {"start_up_pair_loaded": loaded, "startup_reported": StartupReport.received,
                "page_names_zerogpu": "ZeroGPU" in page, "log_tail": log[-600:]}

