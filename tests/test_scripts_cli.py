"""scripts.cli: library ParamErrors come out of a script in its own flags, one line, exit code 2."""
from __future__ import annotations

import argparse

import pytest

from model.inference import SamplingSettings
from model.param_error import ParamError
from scripts import sample
from scripts.cli import flag_errors, option_names, run_main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--top-p", type=float)
    p.add_argument("-n", "--max-new-tokens", type=int)
    sub = p.add_subparsers(dest="command")
    sub.add_parser("go").add_argument("--meta")
    return p


def test_option_names_map_each_dest_to_its_long_flag_subcommands_included():
    names = option_names(parser())
    assert names["top_p"] == "--top-p" and names["max_new_tokens"] == "--max-new-tokens" and names["meta"] == "--meta"


def test_a_param_error_is_translated_to_the_flag_and_mentions_too(capsys):
    @flag_errors(parser, meta_path="--meta")
    def main() -> int:
        raise ParamError("top_p", "0 must lie in (0, 1]; see {meta_path} and {max_new_tokens}",
                         mentions=("meta_path", "max_new_tokens"))

    with pytest.raises(SystemExit) as e:
        run_main(main)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "error: --top-p: 0 must lie in (0, 1]; see --meta and --max-new-tokens\n"


def test_parameters_without_a_flag_keep_their_name_and_other_errors_pass_through():
    @flag_errors(parser)
    def unknown():
        raise ParamError("window", "too wide")

    @flag_errors(parser)
    def plain():
        raise ValueError("not a parameter's fault")

    with pytest.raises(ValueError, match="^window: too wide$"):
        unknown()
    with pytest.raises(ValueError, match="^not a parameter's fault$"):
        plain()


def test_the_sampler_scripts_flags_cover_every_sampling_parameter():
    """SamplingSettings' fields are the parameters its errors name; scripts.sample has a flag for each."""
    names = option_names(sample.build_parser())
    for field in SamplingSettings.__dataclass_fields__:
        assert names[field] == "--" + field.replace("_", "-")


@pytest.mark.parametrize("script", ["bench_decode", "bench_serve", "ablate"])
def test_a_negative_thread_count_is_one_line_and_exit_2_in_every_script_that_takes_one(script, monkeypatch, capsys):
    import importlib

    from tests.inference_fixtures import run_main_inprocess

    module = importlib.import_module(f"scripts.{script}")
    monkeypatch.setattr("torch.set_num_threads", lambda n: pytest.fail(f"set_num_threads({n}) was called"))
    code, _, err = run_main_inprocess(module.main, ["--threads", "-1"], monkeypatch, capsys)
    assert code == 2 and err.startswith("error:") and "--threads" in err and len(err.splitlines()) == 1, err
