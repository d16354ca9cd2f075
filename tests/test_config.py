"""Config loading, overrides and validation: each bad input gives its specific one-line message."""

import ast
import dataclasses
import datetime
import inspect
import re
import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from vlm_grpoma.cli import main
from vlm_grpoma.config import (
    Config,
    ConfigError,
    NonEmpty,
    PromptTemplates,
    _doc_lines,
    check_fields,
    config_reference,
    gradient_accumulation_steps,
    load_config,
    validate,
)
from vlm_grpoma.eval.loading import eval_config
from vlm_grpoma.trainer.deepspeed_config import resolve_precision

GOOD = """
model: {name_or_path: /models/tiny, dtype: float32}
rollout: {num_thoughts: 4, answers_per_thought: 4, temperature: 1.0}
algorithm: {kl_beta: 0.0, loss_aggregation: token_mean}
rewards: {weights: {iou: 1.0, format: 0.5}}
train: {steps: 10, prompts_per_step: 8, micro_batch_prompts: 2}
seed: 3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_good_config_loads_typed_values_and_overrides(tmp_path):
    config = load_config(
        write(tmp_path, GOOD),
        [
            "rollout.num_thoughts=8",
            "optim.learning_rate=2e-5",
            "model.lora.enabled=true",
            "rewards.weights.iou=2",
            "model.lora.target_modules=[q_proj, v_proj]",
        ],
    )
    assert isinstance(config, Config)
    assert config.rollout.num_thoughts == 8 and config.rollout.answers_per_thought == 4
    assert config.optim.learning_rate == 2e-5 and isinstance(config.optim.learning_rate, float)
    assert config.model.lora.enabled is True and config.model.lora.target_modules == ["q_proj", "v_proj"]
    assert config.rewards.weights == {"iou": 2.0, "format": 0.5}
    assert config.algorithm.loss_aggregation == "token_mean" and config.seed == 3
    assert config.to_dict()["train"]["micro_batch_prompts"] == 2


def test_defaults_alone_are_valid():
    validate(load_config())


def test_integers_widen_to_floats_but_not_the_reverse(tmp_path):
    assert load_config(overrides=["rollout.temperature=1"]).rollout.temperature == 1.0
    assert load_config(write(tmp_path, "optim: {learning_rate: 1e-6}")).optim.learning_rate == 1e-6
    with pytest.raises(ConfigError, match=r"^rollout\.num_thoughts: must be an integer, got 4\.5$"):
        load_config(overrides=["rollout.num_thoughts=4.5"])


BAD = [
    ("rollout: {num_thoughts: 1}", r"^rollout\.num_thoughts: must be >= 2 .*got 1$"),
    (
        "rollout: {num_thoughtz: 4}",
        r"^rollout\.num_thoughtz: unknown key \(did you mean 'rollout\.num_thoughts'\?\)$",
    ),
    ("rolout: {num_thoughts: 4}", r"^rolout: unknown key \(did you mean 'rollout'\?\)$"),
    ("rollout: {num_thoughts: four}", r"^rollout\.num_thoughts: must be an integer, got 'four'$"),
    ("rollout: {num_thoughts: true}", r"^rollout\.num_thoughts: must be an integer, got True$"),
    ("rollout: {answers_per_thought: 0}", r"^rollout\.answers_per_thought: must be >= 1, got 0$"),
    ("rollout: {top_p: 1.5}", r"^rollout\.top_p: must be in \(0, 1\], got 1\.5$"),
    ("rollout: 4", r"^rollout: expected a mapping of settings, got int 4$"),
    ("rollout: {adaptive_answers: {first: 1}}", r"^rollout\.adaptive_answers\.first: must be >= 2, got 1$"),
    (
        "rollout: {adaptive_answers: {enabled: true, budget: 40}}",
        r"^rollout\.adaptive_answers\.budget: 40 answers cannot be split over rollout\.num_thoughts = 4 "
        r"thoughts with 2\.\.8 each",
    ),
    (
        "rollout: {adaptive_answers: {enabled: true, first: 3, budget: 10}}",
        r"^rollout\.adaptive_answers\.budget: 10 answers cannot be split .* with 3\.\.8 each",
    ),
    (
        "rollout: {adaptive_answers: {enabled: true, budget: 10}}",
        r"^rollout\.adaptive_answers\.budget: 10 leaves some of the 4 thoughts without an answer beyond their "
        r"first 2: use 8 \(no extra answers\) or >= 12",
    ),
    (
        "rollout: {adaptive_answers: {enabled: true, min_per_thought: 5, max_per_thought: 4}}",
        r"^rollout\.adaptive_answers\.max_per_thought: \(4\) must be >= first \(2\) and >= min_per_thought",
    ),
    (
        "rollout: {temperature: 0, adaptive_answers: {enabled: true}}",
        r"^rollout\.adaptive_answers\.enabled: needs sampled answers \(rollout\.temperature > 0\)",
    ),
    (
        "algorithm: {advantage_scale: mad}",
        r"^algorithm\.advantage_scale: must be one of 'std', 'none', got 'mad'$",
    ),
    ("algorithm: {loss_aggregation: sum}", r"^algorithm\.loss_aggregation: must be one of"),
    ("algorithm: {clip_eps_low: 1.2}", r"^algorithm\.clip_eps_low: must be in \[0, 1\), got 1\.2$"),
    ("algorithm: {kl_beta: -0.1}", r"^algorithm\.kl_beta: must be >= 0, got -0\.1$"),
    ("algorithm: {policy_epochs: 0}", r"^algorithm\.policy_epochs: must be >= 1, got 0$"),
    (
        "model: {lora: {enabled: yes please}}",
        r"^model\.lora\.enabled: must be true or false, got 'yes please'$",
    ),
    (
        "model: {dtype: float8}",
        r"^model\.dtype: must be one of 'auto', 'float32', 'bfloat16', 'float16', got 'float8'$",
    ),
    ("model: {min_pixels: 1000000, max_pixels: 1000}", r"^model\.min_pixels: \(1000000\) must not exceed"),
    (
        "model: {lora: {target_modules: q_proj}}",
        r"^model\.lora\.target_modules: must be a list of str, got 'q_proj'$",
    ),
    ("rewards: {weights: {iou: high}}", r"^rewards\.weights\.iou: must be a number, got 'high'$"),
    ("rewards: {weights: {}}", r"^rewards\.weights: needs at least one reward function$"),
    (
        "train: {eval_every: 5}",
        r"^data\.eval_sets: is empty but train\.eval_every=5; name the held-out records",
    ),
    ("train: {eval_every: -1}", r"^train\.eval_every: must be >= 0 \(0 disables evaluation\), got -1$"),
    (
        "data: {eval_sets: [a.jsonl]}",
        r"^data\.eval_sets: must be a mapping of str to str, got \['a\.jsonl'\]$",
    ),
    ("deepspeed: {zero_stage: 4}", r"^deepspeed\.zero_stage: must be one of 0, 1, 2, 3, got 4$"),
    (
        "train: {async_rollout: {enabled: true}}",
        r"^train\.async_rollout\.enabled: needs rollout\.backend=vllm_server .*got 'hf'$",
    ),
    (
        "rollout: {backend: vllm_server, server: {urls: ['http://h:1']}, adaptive_answers: {enabled: true}}\n"
        "train: {async_rollout: {enabled: true}}",
        r"^train\.async_rollout\.enabled: cannot prefetch with rollout\.adaptive_answers\.enabled",
    ),
    (
        "rollout: {backend: vllm_server, server: {urls: ['http://h:1']}}\n"
        "algorithm: {rollout_correction: {mode: none}}\ntrain: {async_rollout: {enabled: true}}",
        r"^train\.async_rollout\.enabled: needs algorithm\.rollout_correction\.mode tis, mis, mis_two_sided or auto",
    ),
    (
        "train: {async_rollout: {max_staleness: -1}}",
        r"^train\.async_rollout\.max_staleness: must be >= 0, got -1$",
    ),
    ("deepspeed: {zero_stage: true}", r"^deepspeed\.zero_stage: must be one of 0, 1, 2, 3, got True$"),
    (
        "train: {prompts_per_step: 6, micro_batch_prompts: 4}",
        r"^train\.micro_batch_prompts: 4 does not divide the 6 prompts each of 1 rank\(s\) gets per step",
    ),
    ("train: {steps: 0}", r"^train\.steps: must be >= 1, got 0$"),
    ("optim: {learning_rate: 0}", r"^optim\.learning_rate: must be > 0, got 0\.0$"),
    ("seed: [1]", r"^seed: must be an integer, got \[1\]$"),
    ("- a\n- b", r"run\.yaml: the top level must be a mapping of sections, got list$"),
    ("rollout: {num_thoughts: 4\n", r"run\.yaml: not valid YAML at line \d+"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[b[0][:40] for b in BAD])
def test_bad_yaml_gives_its_specific_message(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    "override,message",
    [
        ("rollout.num_thoughts", r"^rollout\.num_thoughts: overrides are written key=value"),
        ("=3", r"^=3: the key before '=' is empty or malformed$"),
        ("rollout..k=3", r"malformed"),
        ("seed.value=3", r"^seed: must be an integer, got \{'value': 3\}$"),
        ("train=3", r"^train: expected a mapping of settings, got int 3$"),
        ("rollout.temperature=[1", r"^rollout\.temperature: cannot parse override value"),
        (  # YAML reads {iou:1.0} as the one key 'iou:1.0' with no value
            "rewards.weights={iou:1.0}",
            r"^rewards\.weights: key 'iou:1\.0' has no value; a YAML flow map needs a space after each colon: "
            r"\{iou: 1\.0\}$",
        ),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_missing_file():
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found$"):
        load_config("nope.yaml")


def test_batch_arithmetic_against_world_size(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert gradient_accumulation_steps(config, world_size=2) == 2
    with pytest.raises(
        ConfigError, match=r"^train\.prompts_per_step: 8 prompts per step do not divide across 3 ranks$"
    ):
        validate(config, world_size=3)
    with pytest.raises(
        ConfigError, match=r"^train\.micro_batch_prompts: 2 does not divide the 1 prompts each of 8"
    ):
        validate(config, world_size=8)


@pytest.mark.parametrize("text,message", BAD[:3] + BAD[-6:-4], ids=[b[0][:40] for b in BAD[:3] + BAD[-6:-4]])
def test_cli_exits_non_zero_with_one_line(tmp_path, capsys, text, message):
    code = main(["train", "--config", str(write(tmp_path, text))])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("vlm-grpoma train: error: ")
    assert __import__("re").search(message.lstrip("^"), err.removeprefix("vlm-grpoma train: error: "))


def test_cli_reads_world_size_from_the_launcher_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--config", str(write(tmp_path, GOOD))]) == 1
    assert "do not divide across 3 ranks" in capsys.readouterr().err


def test_console_script_exit_code(tmp_path):
    exe = Path(sys.executable).with_name("vlm-grpoma")
    result = subprocess.run(
        [str(exe), "train", "--config", str(write(tmp_path, BAD[0][0]))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("vlm-grpoma train: error: rollout.num_thoughts: must be >= 2")


REPO = Path(__file__).resolve().parents[1]
SHIPPED_CONFIGS = sorted(
    path
    for folder in ("configs", "vlm_grpoma/configs", "benchmarks/comparison/configs")
    for path in (REPO / folder).rglob("*.yaml")
)


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_configs_validate(path):
    config = load_config(path)
    validate(config, world_size=8 if "7b" in path.name else 1)


def test_shared_prefix_pass_needs_a_4d_mask_capable_attention():
    with pytest.raises(
        ConfigError, match=r"^train\.logprob_pass: 'shared' needs model\.attn_implementation sdpa"
    ):
        load_config(overrides=["model.attn_implementation=flash_attention_2"])
    load_config(overrides=["model.attn_implementation=flash_attention_2", "train.logprob_pass=naive"])


def test_reward_options_are_typed_and_must_name_a_weighted_reward():
    config = load_config(overrides=["rewards.options={iou: {mode: giou, threshold: 0.5}}"])
    assert config.rewards.options == {"iou": {"mode": "giou", "threshold": 0.5}}
    with pytest.raises(
        ConfigError, match=r"^rewards\.options\.trajectory: options for a reward that is not in"
    ):
        load_config(overrides=["rewards.options={trajectory: {num_points: 8}}"])


def test_vllm_engine_settings_are_validated():
    with pytest.raises(
        ConfigError, match=r"^rollout\.vllm\.gpu_memory_utilization: must be in \(0, 1\], got 1\.5$"
    ):
        load_config(overrides=["rollout.vllm.gpu_memory_utilization=1.5"])


# ---------------------------------------------------------------------------------------------------------
# The documented config: a doc line on every leaf, the reference, and the rules beside the fields.


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Leaf keys walked from the dataclasses themselves (independent of config_reference)."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        keys += _leaf_keys(tp, f"{prefix}{f.name}.") if dataclasses.is_dataclass(tp) else [prefix + f.name]
    return keys


def test_every_leaf_field_has_a_doc_line():
    reference = config_reference()
    assert [doc.key for doc in reference] == _leaf_keys(Config)
    undocumented = [doc.key for doc in reference if len(doc.doc) < 10]
    assert not undocumented, f"fields without a #: doc line above them: {undocumented}"


@dataclasses.dataclass
class _HalfDocumented:
    #: this one is documented
    a: int = 1
    b: int = 2  # a trailing comment is not a doc line


def test_a_field_without_a_doc_line_is_detected():
    assert _doc_lines(_HalfDocumented) == {"a": "this one is documented", "b": ""}


def test_reference_gives_type_default_and_range():
    by_key = {doc.key: doc for doc in config_reference()}
    timeout = by_key["train.dist_timeout_s"]
    assert (timeout.type, timeout.default, timeout.range) == ("float", 600.0, "> 0 seconds, at most 604800")
    assert by_key["seed"].range == "in [0, 4294967295]" and by_key["seed"].default == 0
    assert by_key["algorithm.clip_eps_low"].range == "in [0, 1)"
    assert by_key["data.max_prompt_tokens"].range == ">= 0 (0: no limit)"
    assert by_key["logging.output_dir"].range == "non-empty"
    assert by_key["deepspeed.zero_stage"].type == "one of 0, 1, 2, 3"
    assert (
        "TRL: beta" in by_key["algorithm.kl_beta"].doc
        and "verl: rollout.n" in by_key["rollout.num_thoughts"].doc
    )
    assert "``" not in " ".join(doc.doc for doc in by_key.values())


def _rules() -> list[tuple[str, Any]]:
    found = []

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            elif "rule" in f.metadata:
                found.append((prefix + f.name, tp, f.metadata["rule"]))

    walk(Config, "")
    return found


def _set(key: str, value: Any) -> Config:
    config = Config()
    *sections, name = key.split(".")
    node = config
    for part in sections:
        node = getattr(node, part)
    setattr(node, name, value)
    return config


@pytest.mark.parametrize("key,tp,rule", _rules(), ids=[r[0] for r in _rules()])
def test_each_single_field_rule_holds_at_its_bounds(key, tp, rule):
    """Each bound admits its edge and refuses just past it, with a line naming the key (check_fields)."""
    if isinstance(rule, PromptTemplates):
        check_fields(_set(key, {"detection": "Locate {prompt} ({width}x{height})."}))
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: detect: is not a task"):
            check_fields(_set(key, {"detect": "{prompt}"}))
        return
    if isinstance(rule, NonEmpty):
        check_fields(_set(key, "x" if tp is str else {"x": 1.0}))
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: {re.escape(rule.message)}$"):
            check_fields(_set(key, "  " if tp is str else {}))
        return
    step = 1 if tp is int else 1e-9
    inside, outside = [], []
    for bound, edge_ok, past in (
        (rule.ge, True, -step),
        (rule.gt, False, 0),
        (rule.le, True, step),
        (rule.lt, False, 0),
        (rule.cap, True, step * max(1.0, abs(rule.cap or 0))),
    ):
        if bound is None:
            continue
        edge = tp(bound)
        (inside if edge_ok else outside).append(edge)
        outside.append(tp(bound + past) if edge_ok else edge)
    assert outside, f"{key}: a rule with no bound"
    for value in inside:
        check_fields(_set(key, value))
    for value in outside:
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: must be .*, got "):
            check_fields(_set(key, value))


SECTIONS = "|".join(f.name for f in dataclasses.fields(Config))
#: K >= 2 is training's rule (eval samples K = 1), so it is validate()'s, not the sampling constructor's
SAMPLING_CHECKS = {"rollout.num_thoughts"}


def _literal_text(node: ast.expr) -> str:
    """The literal characters of a string or f-string expression (what the message says, not the code)."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal_text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


def test_validate_keeps_only_rules_between_fields_beside_the_sampling_checks():
    """Single-field ranges left validate() for the field metadata: each check left there names a second key
    (or the world size) in its message, or is one of the rollout's sampling checks; the other sampling checks
    are the sampling parameters' own, which validate() builds."""
    source = textwrap.dedent(inspect.getsource(validate))
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_require"
    ]
    assert len(calls) >= 8 and "SamplingParams.from_config(" in source
    for call in calls:
        key, message = _literal_text(call.args[1]), _literal_text(call.args[2])
        others = re.findall(rf"\b(?:{SECTIONS})\.[a-z_.]+", message.replace(key, ""))
        across = others or "ranks" in message or "rank(s)" in message
        assert key in SAMPLING_CHECKS or across, (
            f"{key}: a single-field check in validate(); put it on the field"
        )


# ---------------------------------------------------------------------------------------------------------
# Hostile YAML and absurd values (issue 36: M9, L11, L12, L13, L14).

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
)


def test_an_alias_bomb_is_refused_in_one_short_line(tmp_path):
    """M9: nine levels of nine aliases (a billion strings from about 400 bytes) are refused, not expanded."""
    assert len(ALIAS_BOMB) < 450
    started = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, ALIAS_BOMB))
    assert time.perf_counter() - started < 2
    assert re.fullmatch(
        r".*run\.yaml: line 2: aliases \(\*a\) are not accepted in a run config; write the value out",
        str(caught.value),
    )
    with pytest.raises(ConfigError, match=r"^data\.eval_sets: cannot parse override value .*aliases \(\*x\)"):
        load_config(overrides=["data.eval_sets={a: &x s.jsonl, b: *x}"])


def test_values_in_errors_are_shortened():
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=["model.lora.target_modules=" + "q" * 100_000])
    assert len(str(caught.value)) < 200 and str(caught.value).startswith(
        "model.lora.target_modules: must be a list"
    )


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"train:\n  steps: \xff\n", r"run\.yaml: not UTF-8 text \(byte 0xff at 16\)$"),
        (b"train: {steps: 3}\x07\n", r"run\.yaml: not valid YAML: character #x0007 at position 17: "),
        (b"[" * 5000 + b"]" * 5000, r"run\.yaml: line 1: nested deeper than 32 levels$"),
        (
            b"rewards: {options: " + b"{a: " * 40 + b"1" + b"}" * 41,
            r"run\.yaml: line 1: nested deeper than 32",
        ),
    ],
    ids=["non-utf8", "control-char", "deep-list", "deep-mapping"],
)
def test_unreadable_yaml_is_one_line(tmp_path, raw, message):
    """L11: non-UTF-8 bytes, control characters and deep nesting in a config file."""
    path = tmp_path / "run.yaml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)


def test_unreadable_overrides_and_saved_configs_are_one_line(tmp_path):
    """L11: the same faults in an override (argv bytes that are not UTF-8 arrive as surrogates) and in a
    run's saved config.yaml, which eval reads."""
    with pytest.raises(ConfigError, match=r"^'train\.steps=\\udcff': an override must be UTF-8 text$"):
        load_config(overrides=["train.steps=\udcff"])
    with pytest.raises(ConfigError, match=r"^rewards\.options: cannot parse override value .*nested deeper"):
        load_config(overrides=["rewards.options=" + "[" * 5000 + "]" * 5000])
    (tmp_path / "config.yaml").write_bytes(b"seed: \xfe\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: not UTF-8 text \(byte 0xfe at 6\)$"):
        eval_config(tmp_path)


def test_leading_zero_integers_are_decimal(tmp_path):
    """L12: YAML 1.1 reads 010 as octal 8; a config means ten (YAML 1.2's reading). Hex, and quoted
    strings that look like numbers, are unchanged, so a saved config.yaml reads back as written."""
    assert load_config(overrides=["train.steps=010"]).train.steps == 10
    assert load_config(write(tmp_path, "train: {steps: 010}\noptim: {warmup_steps: 0x10}")).train.steps == 10
    assert load_config(overrides=["optim.warmup_steps=0x10", "seed=-0"]).optim.warmup_steps == 16
    saved = Config()
    saved.data.train_split, saved.data.train_path, saved.logging.wandb_project = "010", "09", "0o7"
    path = tmp_path / "saved.yaml"
    path.write_text(yaml.safe_dump(saved.to_dict()))
    assert load_config(path) == saved


def test_answers_per_prompt_are_bounded_up_front():
    """L13: K x M is bounded before anything is allocated (K = M = 1000 was a 23 GB allocation)."""
    with pytest.raises(
        ConfigError,
        match=r"^rollout\.num_thoughts: x rollout\.answers_per_thought = 1000 x 1000 = 1000000 answers per "
        r"prompt; at most 4096$",
    ):
        load_config(overrides=["rollout.num_thoughts=1000", "rollout.answers_per_thought=1000"])
    load_config(overrides=["rollout.num_thoughts=64", "rollout.answers_per_thought=64"])


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "seed=9223372036854775808",
            "seed: must be an integer that fits in 64 bits, got 9223372036854775808",
        ),
        ("seed=4294967296", "seed: must be in [0, 4294967295], got 4294967296"),
        ("seed=-1", "seed: must be in [0, 4294967295], got -1"),
        ("train.dist_timeout_s=1e300", "train.dist_timeout_s: must be at most 604800 seconds, got 1e+300"),
        ("optim.learning_rate=1e300", "optim.learning_rate: must be at most 1, got 1e+300"),
        ("optim.adam_beta2=1", "optim.adam_beta2: must be in [0, 1), got 1.0"),
        (
            "rollout.temperature=1e-45",
            "rollout.temperature: must be 0 (greedy) or >= 0.01 (smaller ones "
            "overflow the logits; vLLM raises them to 0.01), got 1e-45",
        ),
    ],
)
def test_absurd_finite_values_are_refused(override, message):
    """L14: finite values that would crash later are refused by their field's range."""
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=[override])
    assert str(caught.value) == message


def test_the_ranges_guard_real_limits():
    """Why those bounds: torch's generator takes the largest seed as the sampler mixes it, a timedelta takes
    the longest timeout (1e300 s overflows it), and logits divided by a 1e-45 temperature are not finite."""
    largest = load_config(overrides=["seed=4294967295", "train.dist_timeout_s=604800"])
    torch.Generator().manual_seed(largest.seed * 1_000_003 + 10**6)  # trainer/sampler's epoch seed
    datetime.timedelta(seconds=largest.train.dist_timeout_s)
    with pytest.raises(OverflowError):
        datetime.timedelta(seconds=1e300)
    assert not torch.isfinite(torch.softmax(torch.tensor([1.0, 2.0]) / 1e-45, dim=-1)).all()
    assert torch.isfinite(torch.softmax(torch.tensor([30.0, 2.0]) / 0.01, dim=-1)).all()


def test_fp16_on_cpu_names_the_key_that_asked_for_it():
    """#32 item 6: with deepspeed.precision=auto, model.dtype chose fp16: the message names model.dtype.
    bf16 trains on CPU (#30: DeepSpeed's CPU accelerator does bf16)."""
    with pytest.raises(ConfigError) as caught:
        resolve_precision(load_config(overrides=["model.dtype=float16"]), on_gpu=False)
    assert str(caught.value) == "model.dtype: float16 needs a GPU; CPU runs train in fp32 or bf16"
    assert resolve_precision(load_config(overrides=["model.dtype=bfloat16"]), on_gpu=False) == "bf16"
