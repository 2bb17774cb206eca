"""Text from outside (a server, a definition, a stored event) made safe to print.

A terminal obeys what it is sent: an ANSI sequence in a tool name, a server's version
or a ledger payload could clear the screen, move the cursor or rewrite the lines a
reviewer reads. ``printable`` escapes every character a terminal would act on or that
would hide text (controls, bidi overrides, lone surrogates), the way Python's
``repr`` spells them. ``json_text`` does the same for JSON output, with JSON's own
escapes, so the output stays valid JSON.
"""

from __future__ import annotations

import json
import math
import re
from functools import partial
from typing import Any, Final

__all__ = ["json_text", "printable"]


def printable(text: str, *, one_line: bool = True) -> str:
    """``text`` with every character a terminal would act on or that would hide text
    escaped (``\\x1b``, ``\\u202e``, ``\\u3164``); with ``one_line``, runs of whitespace
    (newlines included) become one space."""
    if one_line:
        text = " ".join(text.split())
    if text.isprintable() and not _UNPRINTABLE.search(text):
        return text
    return "".join(
        char if char.isprintable() and not _UNPRINTABLE.match(char) else _python_escape(char)
        for char in text
    )


def _python_escape(char: str) -> str:
    """``char`` as Python escapes it; a blank or joiner ``repr`` leaves raw by code."""
    shown = repr(char)[1:-1]
    if shown != char:
        return shown
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# What json.dumps(ensure_ascii=False) leaves raw that a terminal acts on or hides: C1
# controls (U+009B is a CSI), bidi and other format characters, line and paragraph
# separators, lone surrogates, and non-ASCII blanks (U+00A0, U+3164, U+2028): every
# character of Unicode's Cc, Cf, Zl and Zp categories and every blank but the space,
# and the fillers that render blank. JSON escapes
# U+0000 to U+001F itself.
_UNPRINTABLE: Final = re.compile(
    "[\x7f-\xa0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f\u2000-\u200f\u2028-\u202f"
    "\u205f-\u206f\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\ud800-\udfff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff\U000f0000-\U0010ffff]"
)


def json_text(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``value`` as JSON, readable (non-ASCII letters stay as they are) but with every
    character a terminal would act on or hide written as a ``\\uXXXX`` escape.

    Strict JSON: a NaN or infinity (only an edited ledger holds one) is written as the
    string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, which every JSON reader reads.
    """
    dump = partial(
        json.dumps, ensure_ascii=False, indent=indent, sort_keys=sort_keys, allow_nan=False
    )
    try:
        text = dump(value)
    except ValueError:
        text = dump(_finite(value))
    return _UNPRINTABLE.sub(_escaped, text)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as the name JSON would need for it."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _escaped(match: re.Match[str]) -> str:
    return json.dumps(match.group(), ensure_ascii=True)[1:-1]
