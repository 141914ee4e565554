"""Which Hugging Face directories of PipeBD's own layers (model_type `pipebd`, hf_remote/) a job reads back.

Torch-free, so the service checks a registered model before it accepts a spec naming it. A directory is
PipeBD's when its config.json has `model_type: pipebd` and its `auto_map` names PipeBD's two classes; it is
readable when its `pipebd_version` (configuration_pipebd.VERSION of the code that wrote it) is one of
READABLE_VERSIONS. PipeBD then builds it with its own copy of the modeling code, never running the copy in
the directory (no trust_remote_code).
"""

from __future__ import annotations

from typing import Any

MODEL_TYPE = "pipebd"
AUTO_MAP = {
    "AutoConfig": "configuration_pipebd.PipeBDConfig",
    "AutoModelForCausalLM": "modeling_pipebd.PipeBDForCausalLM",
}
# Version 1: block_configs, no padding, rope stored as inverse frequencies. Version 2 adds padded batches
# and `rope_dynamic` (dynamic NTK scaling); a version 1 directory reads as version 2 without them.
READABLE_VERSIONS = ("1", "2")


def is_pipebd_config(config: dict[str, Any]) -> bool:
    """Whether config.json says the directory is PipeBD's heterogeneous network."""
    return config.get("model_type") == MODEL_TYPE


def pipebd_config_problem(config: dict[str, Any]) -> str | None:
    """Why a PipeBD directory's config.json cannot be read back here, or None where it can."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or any(auto_map.get(key) != value for key, value in AUTO_MAP.items()):
        return (
            f"its auto_map {auto_map!r} is not PipeBD's ({AUTO_MAP}): only directories PipeBD wrote are read"
            " back as PipeBD's layers"
        )
    version = config.get("pipebd_version")
    if str(version) not in READABLE_VERSIONS or not isinstance(version, str):
        return (
            f"it was written by PipeBD's modeling code version {version!r}, and this PipeBD reads versions"
            f" {', '.join(READABLE_VERSIONS)}; write it again with this PipeBD (or use the PipeBD that wrote it)"
        )
    blocks = config.get("block_configs")
    if not isinstance(blocks, list) or not blocks:
        return "its block_configs (one description per layer) is missing or empty"
    return None
