"""`ParamError`: a bad value for one named parameter, worded in the library's own terms.

Library functions name their parameter (`temperature: -1 must be >= 0`); only the front ends know what the user
typed. A script renames the parameter to its flag (`--temperature`, `scripts.cli.flag_errors`), the HTTP layer to
its JSON field (`serve.protocol`), both reading `param` and `mentions` instead of parsing the message.
"""
from __future__ import annotations

from typing import Callable, Sequence


class ParamError(ValueError):
    """`param: message`. Other parameters the message refers to are written `{name}` in it and listed in
    `mentions`; they are filled in plainly with str(), or with a front end's names by `render`."""

    def __init__(self, param: str, message: str, mentions: Sequence[str] = ()):
        self.param, self.message, self.mentions = param, message, tuple(mentions)
        super().__init__(self.render())

    def render(self, name: Callable[[str], str] = str) -> str:
        """The message with every parameter called `name(parameter)`."""
        text = self.message
        for m in self.mentions:  # str.replace, not str.format: values in the message may hold braces
            text = text.replace("{" + m + "}", name(m))
        return f"{name(self.param)}: {text}"
