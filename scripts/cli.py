"""Shared command-line plumbing: TOML config + `--section.key value` overrides, and one-line errors.

A config file is data: it is parsed with tomllib, never executed. Every field of every section becomes an option,
so `-h` lists them all with their defaults and the comment written beside them in the dataclass.
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from dataclasses import fields
from typing import Any, Callable, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from train.config import RunConfig

_SECTIONS = ("model", "data", "train", "log")


class Parser(argparse.ArgumentParser):
    """argparse with a short usage line and one-line errors (exit code 2)."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"error: {message} (see {self.prog} -h)\n")


def make_parser(prog: str, doc: str | None, config: bool = True) -> Parser:
    usage = f"{prog} [--config FILE] [--section.key VALUE ...]" if config else None
    return Parser(prog=prog, usage=usage, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def _field_comments(cls: type) -> dict[str, str]:
    """The `# comment` beside each field in the class source: the help text of its option."""
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


def _section_classes() -> dict[str, type]:
    hints = get_type_hints(RunConfig)
    return {name: hints[name] for name in _SECTIONS}


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


def config_from_dict(raw: dict, base: RunConfig | None = None) -> RunConfig:
    """Apply a nested {section: {key: value}} dict onto a RunConfig, rejecting unknown keys and wrong types."""
    cfg = base or RunConfig()
    classes = _section_classes()
    for section, values in raw.items():
        if section not in classes:
            raise ValueError(f"{section}: unknown config section (sections: {', '.join(_SECTIONS)})")
        if not isinstance(values, dict):
            raise ValueError(f"{section}: expected a table of keys")
        hints = get_type_hints(classes[section])
        obj = getattr(cfg, section)
        for key, value in values.items():
            if key not in hints:
                raise ValueError(f"{section}.{key}: unknown config key")
            setattr(obj, key, _coerce(f"{section}.{key}", value, hints[key]))
    return cfg


def load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"--config: no such file {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config: {path} is not valid TOML ({e})") from None


def add_config_options(parser: argparse.ArgumentParser, sections: tuple[str, ...] = _SECTIONS) -> None:
    """Add --config and one --section.key option per field, each showing its default."""
    parser.add_argument("--config", help="TOML preset from configs/ (fields not set keep the defaults below)")
    defaults = RunConfig()
    for section, cls in _section_classes().items():
        if section not in sections:
            continue
        group = parser.add_argument_group(f"[{section}] options")
        comments = _field_comments(cls)
        hints = get_type_hints(cls)
        for f in fields(cls):
            default = getattr(getattr(defaults, section), f.name)
            text = comments.get(f.name, "")
            group.add_argument(f"--{section}.{f.name}", dest=f"{section}.{f.name}", metavar=hints[f.name].__name__.upper(),
                               default=None, help=f"{text} (default: {default!r})".strip())


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """Defaults <- TOML file <- command-line overrides, then validate."""
    cfg = RunConfig()
    if getattr(args, "config", None):
        cfg = config_from_dict(load_toml(args.config), cfg)
    classes = _section_classes()
    overrides: dict[str, dict] = {}
    for dest, text in vars(args).items():
        if "." in dest and text is not None:
            section, key = dest.split(".", 1)
            typ = get_type_hints(classes[section])[key]
            overrides.setdefault(section, {})[key] = _parse_str(dest, text, typ)
    cfg = config_from_dict(overrides, cfg)
    cfg.validate()
    return cfg


def run_main(main: Callable[[], int | None]) -> None:
    """Run a script's main: user errors become one line on stderr and exit code 2 (ATTNGPT_DEBUG=1 shows tracebacks)."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except (ValueError, OSError, RuntimeError) as e:
        if os.environ.get("ATTNGPT_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code or 0)
