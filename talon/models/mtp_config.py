"""Whether a checkpoint directory's ``config.json`` declares MTP layers on an attention-only
target, read as JSON: no torch at import, so the app's preset policy can ask it
(``talon.server.offer``). The full refusal, tensors included, is ``talon.models.mtp.mtp_refusal``."""

from __future__ import annotations

import json
from pathlib import Path

MTP_COUNT_KEYS = ("num_nextn_predict_layers", "num_mtp_layers", "mtp_num_hidden_layers")


def declares_mtp(path: str | Path) -> bool:
    """Does the checkpoint in directory ``path`` declare MTP layers, every layer attention?"""
    config_file = Path(path).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    text = config.get("text_config") or config
    count = next((text[k] for k in MTP_COUNT_KEYS if isinstance(text.get(k), int)), 0)
    types = set(text.get("layer_types") or [])
    return count > 0 and types <= {"full_attention"}
