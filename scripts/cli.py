"""Command-line glue: argparse options for every config field, `--config FILE` + `--section.key value`, and one-line
errors. The config system itself (TOML, types, overrides) is train.config_io; this module only maps flags to it.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import fields
from typing import Callable, get_type_hints

from model.param_error import ParamError
from train.config import RunConfig
from train.config_io import SECTIONS, apply_overrides, field_help, section_classes


class Parser(argparse.ArgumentParser):
    """argparse with a short usage line and one-line errors (exit code 2)."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"error: {message} (see {self.prog} -h)\n")


def make_parser(prog: str, doc: str | None, config: bool = True) -> Parser:
    usage = f"{prog} [--config FILE] [--section.key VALUE ...]" if config else None
    return Parser(prog=prog, usage=usage, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_config_options(parser: argparse.ArgumentParser, sections: tuple[str, ...] = SECTIONS) -> None:
    """Add --config and one --section.key option per field, each showing its default."""
    parser.add_argument("--config", help="TOML preset from configs/ (fields not set keep the defaults below)")
    defaults = RunConfig()
    for section, cls in section_classes().items():
        if section not in sections:
            continue
        group = parser.add_argument_group(f"[{section}] options")
        comments = field_help(cls)
        hints = get_type_hints(cls)
        for f in fields(cls):
            default = getattr(getattr(defaults, section), f.name)
            text = comments.get(f.name, "")
            group.add_argument(f"--{section}.{f.name}", dest=f"{section}.{f.name}", metavar=hints[f.name].__name__.upper(),
                               default=None, help=f"{text} (default: {default!r})".strip())


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """Defaults <- TOML file <- command-line overrides, then validate."""
    cfg = RunConfig.from_toml(args.config) if getattr(args, "config", None) else RunConfig()
    cfg = apply_overrides(cfg, {dest: text for dest, text in vars(args).items() if "." in dest and text is not None})
    cfg.validate()
    return cfg


def option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> long option string (`top_k` -> `--top-k`) of every option of `parser` and of its subcommands."""
    names: dict[str, str] = {}
    for action in parser._actions:  # argparse lists its options nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names = {**option_names(sub), **names}
        long = [o for o in action.option_strings if o.startswith("--")]
        if long:
            names.setdefault(action.dest, long[0])
    return names


def flag_errors(build_parser: Callable[[], argparse.ArgumentParser], **aliases: str) -> Callable:
    """Decorate a script's main so that a library's ParamError names the flags the user typed: the parameter
    `top_p` becomes this parser's `--top-p` (the option whose dest it is, or `aliases[param]`); a parameter the
    script has no flag for keeps its name."""
    def decorate(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except ParamError as e:
                names = {**option_names(build_parser()), **aliases}
                raise ValueError(e.render(lambda p: names.get(p, p))) from e
        return run
    return decorate


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
