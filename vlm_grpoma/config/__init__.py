"""Typed run configuration: dataclasses, YAML loading, dotted ``key=value`` overrides, validation.

Everything here is cheap to import (no torch), so a bad config fails in well under a second, before any
model, dataset or process group is touched. Every error is one line that names the offending key.

Each leaf field carries a ``#:`` doc line above it (what it does, unit and range, the TRL ``GRPOConfig`` /
verl name where one exists) and, where a value can be out of range on its own, a rule in its metadata
(:class:`Range`, :class:`NonEmpty`) that one checker applies to every field. :func:`validate` keeps the rules
that relate several fields. :func:`config_reference` lists every leaf key with its type, default, range and
doc, for ``train --help`` and the config reference page.

Modules: ``rules`` (single-field rules), ``sections`` (the dataclasses), ``checks`` (``validate``), ``loading``
(YAML, overrides, building the dataclasses), ``reference`` (``config_reference``), ``dependencies`` (optional
packages a config needs).
"""

from vlm_grpoma.config.checks import (
    MAX_ANSWERS_PER_PROMPT,
    check_fields,
    gradient_accumulation_steps,
    validate,
)
from vlm_grpoma.config.dependencies import check_optional_dependencies
from vlm_grpoma.config.loading import PEER_CHOICES, config_from_dict, load_config
from vlm_grpoma.config.reference import FieldDoc, _doc_lines, config_reference
from vlm_grpoma.config.rules import NonEmpty, PromptTemplates, Range, Rule, checked
from vlm_grpoma.config.sections import (
    AdaptiveAnswersConfig,
    AlgorithmConfig,
    AsyncRolloutConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    DeepSpeedConfig,
    DynamicSamplingConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RewardNoiseConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    RolloutServerConfig,
    TrainConfig,
    VLLMConfig,
)
from vlm_grpoma.errors import ConfigError

__all__ = [
    "MAX_ANSWERS_PER_PROMPT",
    "PEER_CHOICES",
    "AdaptiveAnswersConfig",
    "AlgorithmConfig",
    "AsyncRolloutConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DeepSpeedConfig",
    "DynamicSamplingConfig",
    "FieldDoc",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "NonEmpty",
    "OptimConfig",
    "PromptTemplates",
    "Range",
    "RewardConfig",
    "RewardNoiseConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "RolloutServerConfig",
    "Rule",
    "TrainConfig",
    "VLLMConfig",
    "_doc_lines",
    "check_fields",
    "check_optional_dependencies",
    "checked",
    "config_from_dict",
    "config_reference",
    "gradient_accumulation_steps",
    "load_config",
    "validate",
]
