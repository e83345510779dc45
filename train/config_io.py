"""Reading a run config: TOML files (data, parsed with tomllib, never executed), nested dicts, checkpoints, and
`section.key` overrides. Unknown keys and wrong types are a one-line ValueError naming the key.

`field_help` reads the `# comment` beside each dataclass field: the help text the scripts show for its option.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from model.param_error import ParamError
from train.config import RunConfig

SECTIONS = ("model", "data", "train", "log")


def section_classes() -> dict[str, type]:
    hints = get_type_hints(RunConfig)
    return {name: hints[name] for name in SECTIONS}


def field_help(cls: type) -> dict[str, str]:
    """The `# comment` beside each field in the class source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    for line in source.splitlines():
        m = re.match(r"\s+(\w+):\s*[^=]+=.*?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _coerce(key: str, value: Any, typ: type) -> Any:
    """Check a TOML value against the field type; ints are accepted where floats are expected."""
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, typ)
    if not ok:
        raise ValueError(f"{key}: expected {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def unescape(text: str) -> str:
    r"""Only \n, \t and \\: enough to type a newline on a command line, without mangling non-ASCII text or paths."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_str(key: str, text: str, typ: type) -> Any:
    """Turn a command-line string into the field's type."""
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{key}: expected true or false, got {text!r}")
    if typ in (int, float):
        try:
            return typ(text)
        except ValueError:
            raise ValueError(f"{key}: expected {typ.__name__}, got {text!r}") from None
    return unescape(text)


def apply_dict(raw: dict, base: RunConfig | None = None) -> RunConfig:
    """Apply a nested {section: {key: value}} dict of typed values onto a RunConfig (a copy of `base`)."""
    import copy

    cfg = copy.deepcopy(base) if base is not None else RunConfig()
    classes = section_classes()
    for section, values in raw.items():
        if section not in classes:
            raise ValueError(f"{section}: unknown config section (sections: {', '.join(SECTIONS)})")
        if not isinstance(values, dict):
            raise ValueError(f"{section}: expected a table of keys")
        hints = get_type_hints(classes[section])
        obj = getattr(cfg, section)
        for key, value in values.items():
            if key not in hints:
                raise ValueError(f"{section}.{key}: unknown config key")
            setattr(obj, key, _coerce(f"{section}.{key}", value, hints[key]))
    return cfg


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """The one way to change fields by name: {"train.lr": "3e-4", "model.n_layer": 4}. Strings (from a command
    line) are parsed to the field's type; typed values are checked like TOML values."""
    classes = section_classes()
    nested: dict[str, dict] = {}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if section not in classes or not key:
            raise ValueError(f"{dotted}: expected section.key with a section of {', '.join(SECTIONS)}")
        hints = get_type_hints(classes[section])
        if key not in hints:
            raise ValueError(f"{dotted}: unknown config key")
        nested.setdefault(section, {})[key] = _parse_str(dotted, value, hints[key]) if isinstance(value, str) else value
    return apply_dict(nested, cfg)


def read_toml(path: str | os.PathLike) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ParamError("config", f"no such file {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ParamError("config", f"{path} is not valid TOML ({e})") from None


def checkpoint_sections(path: str | os.PathLike) -> dict:
    """The four config sections saved in a checkpoint's config.json (a run folder or a checkpoint directory)."""
    from model.checkpoint import read_run_config, resolve_checkpoint_dir

    saved = read_run_config(resolve_checkpoint_dir(path))
    return {name: saved[name] for name in SECTIONS if isinstance(saved.get(name), dict)}
