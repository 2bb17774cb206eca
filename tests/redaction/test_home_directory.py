"""A home directory of one segment (``/root``, ``/app``) is a host path the model must
not see, though the generic pattern only masks paths of two segments or more."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkernel.redaction import HOST_PATH_MASK, Redactor, StreamRedactor

HOME = "/srvhome"
WORKSPACE = Path("/work/space")


@pytest.fixture
def redactor(monkeypatch: pytest.MonkeyPatch) -> Redactor:
    monkeypatch.setenv("HOME", HOME)
    return Redactor(WORKSPACE)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"home": "/srvhome"}', f'{{"home": "{HOST_PATH_MASK}"}}'),
        ("cd /srvhome; ls", f"cd {HOST_PATH_MASK}; ls"),
        ("home is /srvhome.", f"home is {HOST_PATH_MASK}."),
        ("HOME=/srvhome", f"HOME={HOST_PATH_MASK}"),
        ("/srvhome/", HOST_PATH_MASK),
        # Not the home: a longer name, part of a URL or of a relative path.
        ("/srvhomes", "/srvhomes"),
        ("/srvhome.bak", "/srvhome.bak"),
        ("https://example.org/srvhome", "https://example.org/srvhome"),
        ("~/srvhome and a/srvhome", "~/srvhome and a/srvhome"),
    ],
)
def test_the_home_is_masked_by_name(redactor: Redactor, text: str, shown: str) -> None:
    assert redactor.redact_text(text, Counter()) == shown


def test_a_home_of_two_segments_is_left_to_the_generic_pattern(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    counts: Counter[str] = Counter()
    assert Redactor(WORKSPACE).redact_text("at /home/alice", counts) == f"at {HOST_PATH_MASK}"
    assert counts == Counter({"host-path": 1})


_AROUND = st.text(alphabet=" \n\t\"'=:;,()[]{}.-_axyz/", max_size=12)


@given(parts=st.lists(_AROUND, min_size=1, max_size=5))
def test_no_standalone_home_survives_whole_or_streamed(parts: list[str]) -> None:
    """Property: wherever the home stands alone, neither a whole-text pass nor a stream
    cut anywhere leaves it in the output."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", HOME)
        redactor = Redactor(WORKSPACE)
    text = HOME.join(parts)
    standalone = re.compile(rf"(?<![\w.~/%-]){re.escape(HOME)}(?![\w@+-]|\.[\w.@+-]|/)")
    whole = redactor.redact_text(text, Counter())
    assert standalone.search(whole) is None, whole
    stream = StreamRedactor(redactor)
    streamed = "".join(stream.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    streamed += stream.close()
    assert standalone.search(streamed) is None, streamed


def test_a_home_left_standing_by_the_path_pass_is_masked_with_its_path() -> None:
    """Found by the property above: the path pass masks "/srvhome/" and leaves
    "/srvhome/srvhome", whose head then stands alone after the mask."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", HOME)
        redactor = Redactor(WORKSPACE)
    text = "/srvhome//srvhome/srvhome"
    assert redactor.redact_text(text, Counter()) == HOST_PATH_MASK * 2
    stream = StreamRedactor(redactor)
    streamed = "".join(stream.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    assert "srvhome" not in streamed + stream.close()
