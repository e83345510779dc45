"""model.param_error: the library names its parameter; front ends rename it (and the others it mentions)."""
from __future__ import annotations

import pytest

from model.param_error import ParamError


def test_the_message_names_the_parameter_and_keeps_its_own_braces():
    e = ParamError("quantize", "int8 on cpu needs {dtype} float32, not {'a': 1}", mentions=("dtype",))
    assert isinstance(e, ValueError) and e.param == "quantize"
    assert str(e) == "quantize: int8 on cpu needs dtype float32, not {'a': 1}"
    flags = {"quantize": "--quantize", "dtype": "--dtype"}
    assert e.render(flags.get) == "--quantize: int8 on cpu needs --dtype float32, not {'a': 1}"


def test_it_is_raised_and_caught_as_a_value_error():
    with pytest.raises(ValueError, match="^top_p: 0 must lie"):
        raise ParamError("top_p", "0 must lie in (0, 1]")
