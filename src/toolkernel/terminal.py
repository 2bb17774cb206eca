"""Text from outside (a server, a definition, a stored event) made safe to print.

A terminal obeys what it is sent: an ANSI sequence in a tool name, a server's version
or a ledger payload could clear the screen, move the cursor or rewrite the lines a
reviewer reads. ``printable`` escapes every character a terminal would act on or that
would hide text (controls, bidi overrides, lone surrogates), the way Python's
``repr`` spells them.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str, *, one_line: bool = True) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\u202e``);
    with ``one_line``, runs of whitespace (newlines included) become one space."""
    if one_line:
        text = " ".join(text.split())
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
