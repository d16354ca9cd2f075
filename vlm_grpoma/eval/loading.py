"""A checkpoint made ready for evaluation (``eval``, ``manip-eval``): its model folder, the run config it was
trained with, the model on the available accelerator, and the rollout backend that config names.

``--checkpoint`` may be a run folder (its newest complete checkpoint), a ``checkpoints/step-N`` folder or the
``model/`` folder inside one, full weights or a LoRA adapter. Without ``--config`` the run's saved
``<output_dir>/config.yaml`` is found from the checkpoint's path, so the evaluated model sees the pixel bounds,
prompt style, dtype and token budgets it was trained with. A saved config travels with a downloaded run folder,
so it does not choose what runs or where requests and results go (:data:`UNTRUSTED_SAVED_KEYS`): those keys keep
their defaults unless the user passes them, results go into the folder the config was found in, and the
config's description says which saved keys were ignored. Its data paths are kept: they are only read, for
this evaluation, on this machine (and ``eval --checkpoint RUN`` should evaluate a run on its own held-out data).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlm_grpoma.config import Config, load_config
from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.run_layout import CHECKPOINTS_DIR, META_FILE, MODEL_DIR, STEP_GLOB, checkpoint_root
from vlm_grpoma.run_layout import CONFIG_FILE as RUN_CONFIG

if TYPE_CHECKING:
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rollout.base import RolloutEngine


def model_folder(checkpoint: str | Path) -> Path:
    """The Hugging Face folder to load for ``checkpoint`` (run folder, step folder or model folder)."""
    path = Path(checkpoint)
    if not path.is_dir():
        raise CheckpointError(f"--checkpoint {path}: not a folder")
    if checkpoint_root(path).is_dir():
        complete = sorted(p.parent for p in checkpoint_root(path).glob(f"{STEP_GLOB}/{META_FILE}"))
        if not complete:
            raise CheckpointError(f"--checkpoint {path}: a run folder without a complete checkpoint")
        path = complete[-1]  # step numbers are zero-padded: the last name is the newest
    if (path / MODEL_DIR).is_dir() and (path / META_FILE).is_file():
        path = path / MODEL_DIR
    if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise CheckpointError(
            f"--checkpoint {path}: neither a model folder (config.json) nor a LoRA adapter "
            "(adapter_config.json); name a run, a checkpoints/step-N folder or its model/ folder"
        )
    return path


def run_config_path(model_dir: str | Path) -> Path | None:
    """The ``config.yaml`` saved with ``model_dir``: beside it, in its step folder, or in the output folder of
    the run that wrote it (``<run>/checkpoints/step-N/model``); None when there is none."""
    folder = Path(model_dir).resolve()
    candidates = [folder]
    if folder.name == MODEL_DIR:
        candidates.append(folder.parent)
        if folder.parent.parent.name == CHECKPOINTS_DIR:
            candidates.append(folder.parent.parent.parent)
    for candidate in candidates:
        if (candidate / RUN_CONFIG).is_file():
            return candidate / RUN_CONFIG
    return None


#: Keys a run's saved config may not set for an evaluation: running the checkpoint's own Python, a rollout
#: server to send every image to (and the secret to sign with), the folder results are written to.
#: ``rollout.backend`` too when it names servers.
UNTRUSTED_SAVED_KEYS = (
    "model.trust_remote_code",
    "rollout.server.urls",
    "rollout.server.token_file",
    "logging.output_dir",
)


def _get(config: object, key: str) -> object:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def _set(config: object, key: str, value: object) -> object:
    head, _, rest = key.partition(".")
    return replace(config, **{head: _set(getattr(config, head), rest, value) if rest else value})


def without_untrusted_keys(
    saved: Config, overrides: list[str] | tuple[str, ...], run_folder: Path
) -> tuple[Config, list[str]]:
    """``saved`` with every :data:`UNTRUSTED_SAVED_KEYS` value the user did not pass replaced (the default;
    ``logging.output_dir``: ``run_folder``, where the config was found), and the keys whose value changed;
    ``rollout.backend=vllm_server`` goes back to the default backend with its URLs."""
    passed = {item.split("=", 1)[0].strip() for item in overrides}
    trusted = replace(Config(), logging=replace(Config().logging, output_dir=str(run_folder)))
    keys = [*UNTRUSTED_SAVED_KEYS, *(["rollout.backend"] if saved.rollout.backend == "vllm_server" else [])]
    ignored = []
    for key in keys:
        if key in passed or any(key.startswith(p + ".") for p in passed):
            continue
        value = _get(trusted, key)
        if _get(saved, key) != value:
            if key != "logging.output_dir":  # a moved run folder is not worth a notice
                ignored.append(key)
            saved = _set(saved, key, value)
    return saved, ignored


@dataclass(frozen=True)
class EvalConfig:
    """The config an evaluation uses and where it came from (printed, and written into the results)."""

    config: Config
    source: str


def eval_config(
    model_dir: Path, config_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> EvalConfig:
    """``--config`` when given, else the run's saved config found from ``model_dir``, else the defaults;
    ``key=value`` overrides apply to whichever is used."""
    if config_path:
        return EvalConfig(load_config(config_path, overrides), f"{config_path} (--config)")
    found = run_config_path(model_dir)
    if found is not None:
        config, ignored = without_untrusted_keys(load_config(found, overrides), overrides, found.parent)
        notice = (
            f"; not taken from it: {', '.join(ignored)} (a run folder does not choose code to run, servers to "
            "call or files to read: pass them as key=value to use them)"
            if ignored
            else ""
        )
        return EvalConfig(config, f"{found} (the run's saved config{notice})")
    return EvalConfig(
        load_config(None, overrides),
        f"the defaults (no --config and no {RUN_CONFIG} above {model_dir}): pixel bounds, prompt style "
        "and token budgets may differ from training",
    )


def accelerator() -> Any:
    """This process's GPU when there is one (``LOCAL_RANK`` under a launcher), else the CPU."""
    import os

    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass
class EvalModel:
    """A loaded checkpoint: the model (eval mode, on ``device``), its adapter and the rollout engine."""

    model: Any
    adapter: QwenVLAdapter
    rollout: RolloutEngine
    device: Any
    model_dir: Path
    base: str  # the full model at the bottom of a LoRA adapter chain ('' for full weights)

    def describe(self) -> str:
        kind = f"LoRA adapter on {self.base}" if self.base else "full weights"
        return f"{self.model_dir} ({kind}) on {self.device}"


def load_for_eval(model_dir: str | Path, config: Config) -> EvalModel:
    """Load ``model_dir`` with ``config.model``'s settings (adapters merged), move it to the accelerator and
    build ``rollout.backend``'s engine for it (vLLM starts from the full base and takes the merged weights)."""
    from vlm_grpoma.models.loading import load_model
    from vlm_grpoma.models.prompts import prompt_text
    from vlm_grpoma.models.sources import adapter_chain
    from vlm_grpoma.rollout.backends import build_rollout_engine

    model_dir = Path(model_dir)
    chain = adapter_chain(model_dir)
    loaded = load_model(replace(config.model, name_or_path=str(model_dir)))
    loaded.adapter.prompt_text = prompt_text(config.data)
    device = accelerator()
    model = loaded.model.to(device).eval()
    engine_config = replace(config, model=replace(config.model, name_or_path=chain.base))
    rollout = build_rollout_engine(engine_config, model, loaded.adapter)
    return EvalModel(
        model, loaded.adapter, rollout, device, model_dir, chain.base if chain.is_adapter else ""
    )


__all__ = [
    "RUN_CONFIG",
    "EvalConfig",
    "EvalModel",
    "accelerator",
    "eval_config",
    "load_for_eval",
    "model_folder",
    "run_config_path",
]
