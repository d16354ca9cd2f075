"""Reading a config: YAML refused where it could only be a mistake or an attack, dotted overrides, and typed
dataclasses built from plain data with the dotted key in every error."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from vlm_grpoma.config.checks import validate
from vlm_grpoma.config.sections import Config
from vlm_grpoma.errors import ConfigError

# Building typed dataclasses from plain data, with the dotted key in every error.

_shown = reprlib.Repr()  # values in messages stay short, however large (or deeply nested) they are
_shown.maxstring = _shown.maxother = 80
_shown.maxlist = _shown.maxdict = _shown.maxtuple = 8
_shown.maxlevel = 3
_INT64 = 2**63


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        return str(tp).replace("typing.", "")
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


#: choices a peer names differently (TRL's loss_type, importance_sampling_level): the advice a refusal gives
PEER_CHOICES: dict[str, dict[str, str]] = {
    "algorithm.loss_aggregation": {
        "grpo": "TRL's loss_type 'grpo' is seq_mean_token_mean here",
        "dapo": "TRL's loss_type 'dapo' is token_mean here",
        "dr_grpo": "TRL's loss_type 'dr_grpo' is seq_mean_token_sum_norm here",
        "bnpo": "TRL's loss_type 'bnpo' normalises each micro-batch by its own token count, so its gradient "
        "depends on the micro-batching, which this trainer rules out; token_mean equals it without gradient "
        "accumulation (and equals TRL's dapo with it)",
    },
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it (ints widen to float)."""
    origin = typing.get_origin(tp)
    shown = _shown.repr(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of settings, got {type(value).__name__} {shown}")
        return _build(tp, value, key)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed):
            advice = PEER_CHOICES.get(key, {}).get(value) if isinstance(value, str) else None
            raise ConfigError(
                f"{key}: must be {_type_name(tp)}, got {shown}" + (f" ({advice})" if advice else "")
            )
        return value
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(
            f"{key}: must be {' or '.join(_type_name(a) for a in typing.get_args(tp))}, got {shown}"
        )
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: must be a list of {_type_name(item_tp)}, got {shown}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(
                f"{key}: must be a mapping of {_type_name(key_tp)} to {_type_name(item_tp)}, got {shown}"
            )
        for k, v in value.items():
            if v is None and isinstance(k, str) and ":" in k:  # YAML read {iou:1.0} as the one key "iou:1.0"
                name, _, rest = k.partition(":")
                raise ConfigError(
                    f"{key}: key {k!r} has no value; a YAML flow map needs a space after each colon: "
                    f"{{{name}: {rest}}}"
                )
        return {_coerce(k, key_tp, key): _coerce(v, item_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, got {shown}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, got {shown}")
        if not -_INT64 <= value < _INT64:
            raise ConfigError(f"{key}: must be an integer that fits in 64 bits, got {shown}")
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string; accept what float() reads
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: must be a number, got {shown}")
        if isinstance(value, int) and abs(value) > 1e308:
            raise ConfigError(f"{key}: must be a finite number, got {shown}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {shown}")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} at {key}")  # a bug in this module, not user input


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
            raise ConfigError(f"{_shown.repr(key)[1:-1]}: unknown key{hint}")
        kwargs[name] = _coerce(value, hints[name], key)
    return cls(**kwargs)


# Reading YAML: a config is small, flat and written by hand, so what could only be a mistake or an attack is
# refused in one line — aliases (a few hundred bytes expand to gigabytes), deep nesting, non-UTF-8 text —
# and `010` is ten (as in YAML 1.2), not YAML 1.1's octal eight.

MAX_YAML_DEPTH = 32  # the deepest config key is 4 levels (rewards.options.<name>.<option>)


class _YAMLRefused(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, with bounded nesting, leading-zero integers read as decimal."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _YAMLRefused(
                f"aliases (*{event.anchor}) are not accepted in a run config; write the value out",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YAMLRefused(
                    f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> int:
        text = str(self.construct_scalar(node)).replace("_", "")
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            return int(text, 10)  # YAML 1.1 reads 010 as octal 8; a config means ten
        return super().construct_yaml_int(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)


def _load_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the config loader; any problem is one ConfigError line naming ``source``."""
    try:
        loader = _ConfigLoader(text)  # its reader refuses control characters at once
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _YAMLRefused as err:
        raise ConfigError(f"{source}: line {err.problem_mark.line + 1}: {err.problem}") from None
    except yaml.reader.ReaderError as err:
        raise ConfigError(
            f"{source}: not valid YAML: character #x{err.character:04x} at position {err.position}: "
            f"{err.reason}"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{source}: not valid YAML{where}: {getattr(err, 'problem', None) or err}"
        ) from None


def _parse_override(text: str) -> tuple[list[str], Any]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 arrive from argv as lone surrogates
        raise ConfigError(f"{ascii(text)}: an override must be UTF-8 text") from None
    if "=" not in text:
        raise ConfigError(f"{text}: overrides are written key=value, e.g. rollout.num_thoughts=4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{text}: the key before '=' is empty or malformed")
    if not raw.strip():
        return key.split("."), ""
    try:
        value = _load_yaml(raw, key)
    except ConfigError as err:
        reason = str(err).removeprefix(f"{key}: ")
        raise ConfigError(f"{key}: cannot parse override value {_shown.repr(raw)}: {reason}") from None
    return key.split("."), value


def _set_dotted(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"{'.'.join(parts[: i + 1])}: is a value, not a section; cannot set {'.'.join(parts)}"
            )
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (optional), apply ``key=value`` overrides, build and validate the config."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at {err.start})"
            ) from None
        except OSError as err:
            raise ConfigError(f"{path}: cannot read the config: {err.strerror or err}") from None
        loaded = _load_yaml(text, str(path))
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}"
            )
        tree = loaded
    return config_from_dict(tree, overrides)


def config_from_dict(tree: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build and validate a config from plain data (e.g. ``Config.to_dict()``) and ``key=value`` overrides."""
    tree = copy.deepcopy(tree)
    for text in overrides:
        parts, value = _parse_override(text)
        _set_dotted(tree, parts, value)
    config = _build(Config, tree)
    validate(config)
    return config
