"""artifact.read never shows a secret or a host path in part: not across ranges, not
without its keyword."""

from __future__ import annotations

import string
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secret_strategies import mixed
from toolkernel.artifacts import ArtifactStore
from toolkernel.calls import ArtifactRef
from toolkernel.codes import Status
from toolkernel.kernel import Kernel
from toolkernel.redaction import HOST_PATH_MASK, SECRET_MASK
from toolkernel.testing import make_kernel
from toolkernel.tools import install

CONFIG = """
[[exposure]]
tools = ["*"]
"""
KNOWN = "injected-known-value-9"
TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
FRAGMENT = 8  # no returned range may hold this many characters of a secret in a row


@contextmanager
def artifact_kernel(root: Path) -> Iterator[Kernel]:
    kernel = make_kernel(root / "ws", CONFIG, workspace_tools=False, secrets=[KNOWN])
    assert install(kernel) is not None
    try:
        yield kernel
    finally:
        kernel.close()


def stored_unmasked(kernel: Kernel, data: bytes, **fields: Any) -> ArtifactRef:
    """``data`` stored as an artifact made before the kernel knew its secrets (the
    kernel's own store masks them on the way in): artifact.read masks them on reading."""
    return ArtifactStore(kernel.artifacts.root).put(data, **fields)


def read(kernel: Kernel, artifact_id: str, **bounds: int) -> dict[str, object]:
    result = kernel.call_sync(
        kernel.start_run(), "artifact.read", {"artifactId": artifact_id, **bounds}
    )
    assert result.status is Status.SUCCEEDED, result.safe_message
    output = result.structured_output
    assert isinstance(output, dict)
    return output


def fragments(secret: str) -> set[str]:
    return {secret[i : i + FRAGMENT] for i in range(len(secret) - FRAGMENT + 1)}


def shows_part_of(content: str, secret: str) -> bool:
    return any(part in content for part in fragments(secret))


def test_a_token_split_across_two_byte_ranges_is_withheld_from_both(tmp_path):
    # The explorer's case: a large output kept as an artifact, its token near the end.
    data = ("\n".join(f"line {i}" for i in range(3000)) + f'\ntoken {TOKEN}"]}}').encode()
    cut = data.index(TOKEN.encode()) + 20
    with artifact_kernel(tmp_path) as kernel:
        ref = stored_unmasked(kernel, data, media_type="application/json")
        first = read(kernel, ref.id, startByte=cut - 40, endByte=cut)
        second = read(kernel, ref.id, startByte=cut, endByte=len(data))
    contents = [str(first["content"]), str(second["content"])]
    assert TOKEN not in "".join(contents)
    assert not any(shows_part_of(content, TOKEN) for content in contents)
    assert contents == ["998\nline 2999\ntoken " + SECRET_MASK, SECRET_MASK + '"]}']
    assert first["withheld"] == second["withheld"] == {"github-token": 1}
    assert (first["endByte"], second["startByte"]) == (cut, cut)


def test_a_value_read_without_its_keyword_is_still_withheld(tmp_path):
    value = "Sup3rS3cretV4lu3x"
    data = f"config loaded\npassword = {value}\nready\n".encode()
    with artifact_kernel(tmp_path) as kernel:
        ref = stored_unmasked(kernel, data)
        out = read(kernel, ref.id, startByte=data.index(value.encode()))
    assert out["content"] == f"{SECRET_MASK}\nready\n"
    assert out["withheld"] == {"password-assignment": 1}


def test_a_line_cut_short_by_max_bytes_does_not_show_the_start_of_a_token(tmp_path):
    data = f"first\nexport GITHUB={TOKEN} # set\nlast\n".encode()
    with artifact_kernel(tmp_path) as kernel:
        ref = stored_unmasked(kernel, data)
        out = read(kernel, ref.id, startLine=2, maxBytes=30)
    assert out["content"] == f"export GITHUB={SECRET_MASK}"
    assert out["nextLine"] == 3


def test_offsets_stay_exact_around_multibyte_text(tmp_path):
    text = f"héllo wörld ✓ {KNOWN} ünïcode ✓ tail"
    data = text.encode()
    at = data.index(KNOWN.encode())
    with artifact_kernel(tmp_path) as kernel:
        ref = stored_unmasked(kernel, data)
        before = read(kernel, ref.id, endByte=at + 5)
        after = read(kernel, ref.id, startByte=at + 5)
        whole = read(kernel, ref.id)
    assert before["content"] == f"héllo wörld ✓ {SECRET_MASK}"
    assert after["content"] == f"{SECRET_MASK} ünïcode ✓ tail"
    assert whole["content"] == text.replace(KNOWN, SECRET_MASK)


# (what is written, the secret in it that must never show in part)
PLANTED = st.one_of(
    mixed(36).map(lambda s: ("ghp_" + s, "ghp_" + s)),
    st.text(st.sampled_from(string.ascii_uppercase + string.digits), min_size=16, max_size=16)
    .map(lambda s: "AKIA" + s)
    .map(lambda s: (s, s)),
    st.tuples(mixed(20), mixed(30), mixed(43))
    .map(lambda t: f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}")
    .map(lambda s: (s, s)),
    mixed(48).map(lambda s: ("sk-proj-" + s, "sk-proj-" + s)),
    mixed(14).map(lambda s: (f"DB_PASSWORD={s}", s)),
    st.just((KNOWN, KNOWN)),
    st.lists(mixed(64), min_size=2, max_size=6)
    .map(
        lambda rows: (
            "-----BEGIN RSA PRIVATE KEY-----\n"
            + "\n".join(rows)
            + "\n-----END RSA PRIVATE KEY-----"
        )
    )
    .map(lambda s: (s, s)),
)
# Filler that cannot itself hold eight characters of a secret in a row.
WORDS = st.sampled_from(["ok", "line", "x=1", "{", "}", '"', ",", "done", "é", "✓", "7"])
FILLER = st.lists(st.one_of(WORDS, st.sampled_from([" ", "\n", " ", "\n\n"])), max_size=40).map(
    lambda parts: " ".join(parts)
)
SEPARATORS = st.sampled_from([" ", "\n", '"', ": ", "=", "\t"])


@st.composite
def planted_texts(draw: st.DrawFn) -> tuple[bytes, list[str]]:
    parts: list[str] = [draw(FILLER)]
    secrets: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        written, secret = draw(PLANTED)
        parts += [draw(SEPARATORS), written, draw(SEPARATORS), draw(FILLER)]
        secrets.append(secret)
    return "".join(parts).encode(), secrets


@st.composite
def cuts(draw: st.DrawFn, size: int) -> list[int]:
    inner = draw(st.lists(st.integers(min_value=1, max_value=size - 1), max_size=6, unique=True))
    return [0, *sorted(inner), size]


def test_no_split_of_a_text_into_ranges_shows_a_planted_secret_in_part(tmp_path):
    with artifact_kernel(tmp_path) as kernel:

        @settings(
            max_examples=80,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(planted_texts(), st.data())
        def check(planted: tuple[bytes, list[str]], data: st.DataObject) -> None:
            text, secrets = planted
            ref = stored_unmasked(kernel, text)
            points = data.draw(cuts(len(text)))
            contents = [
                str(read(kernel, ref.id, startByte=start, endByte=end)["content"])
                for start, end in pairwise(points)
            ]
            joined = "".join(contents)
            for secret in secrets:
                assert secret not in joined
                for content in contents:
                    assert not shows_part_of(content, secret), (content, secret)

        check()


def test_ranges_of_a_text_without_secrets_come_back_exactly(tmp_path):
    with artifact_kernel(tmp_path) as kernel:

        @settings(max_examples=40, deadline=None)
        @given(
            st.text(st.sampled_from(string.ascii_letters + " \n=:,.{}\"'"), min_size=2), st.data()
        )
        def check(text: str, data: st.DataObject) -> None:
            encoded = text.encode()
            ref = stored_unmasked(kernel, encoded)
            points = data.draw(cuts(len(encoded)))
            pieces = [
                read(kernel, ref.id, startByte=start, endByte=end)
                for start, end in pairwise(points)
            ]
            # Plain words can still look like a secret; then the check does not apply.
            if any("withheld" in piece for piece in pieces):
                return
            assert "".join(str(piece["content"]) for piece in pieces) == text

        check()


HOST_PATH = "/home/alice/clients/acme-merger/build/secret_plan.py"


def test_a_host_path_cut_by_a_byte_range_is_masked_not_shown_in_part(tmp_path):
    data = f"Traceback hint: error in {HOST_PATH} line 3\n".encode()
    at = data.index(HOST_PATH.encode())
    with artifact_kernel(tmp_path) as kernel:
        ref = stored_unmasked(kernel, data)
        whole = read(kernel, ref.id)
        starts_inside = read(kernel, ref.id, startByte=at + 1)
        ends_inside = read(kernel, ref.id, endByte=at + 9)
    assert whole["content"] == f"Traceback hint: error in {HOST_PATH_MASK} line 3\n"
    assert starts_inside["content"] == f"{HOST_PATH_MASK} line 3\n"
    assert ends_inside["content"] == f"Traceback hint: error in {HOST_PATH_MASK}"
    assert starts_inside["withheld"] == ends_inside["withheld"] == {"host-path": 1}


def test_a_workspace_path_is_shown_relative_whole_and_masked_when_cut(tmp_path):
    with artifact_kernel(tmp_path) as kernel:
        inside = f"{kernel.config.workspace}/src/app.py"
        data = f"see {inside}:3\n".encode()
        at = data.index(inside.encode())
        ref = stored_unmasked(kernel, data)
        whole = read(kernel, ref.id)
        cut = read(kernel, ref.id, startByte=at + 2)
    assert whole["content"] == "see src/app.py:3\n"
    assert "withheld" not in whole
    assert cut["content"] == f"{HOST_PATH_MASK}:3\n"


SEGMENTS = st.lists(
    st.text(
        st.sampled_from(string.ascii_lowercase + string.digits + "_-."), min_size=1, max_size=12
    ).filter(lambda s: s not in (".", "..")),
    min_size=2,
    max_size=6,
)


@st.composite
def texts_with_a_path_and_a_secret(draw: st.DrawFn) -> tuple[bytes, str, str]:
    path = "/" + "/".join(draw(SEGMENTS))
    written, secret = draw(PLANTED)
    planted = [path, written]
    if draw(st.booleans()):
        planted.reverse()
    parts = [draw(FILLER)]
    for item in planted:
        parts += [draw(SEPARATORS), item, draw(SEPARATORS), draw(FILLER)]
    return "".join(parts).encode(), path, secret


def test_no_range_shows_part_of_a_host_path_or_a_secret(tmp_path):
    with artifact_kernel(tmp_path) as kernel:

        @settings(
            max_examples=80,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(texts_with_a_path_and_a_secret(), st.data())
        def check(planted: tuple[bytes, str, str], data: st.DataObject) -> None:
            text, path, secret = planted
            ref = stored_unmasked(kernel, text)
            points = data.draw(cuts(len(text)))
            contents = [
                str(read(kernel, ref.id, startByte=start, endByte=end)["content"])
                for start, end in pairwise(points)
            ]
            line = data.draw(st.integers(min_value=1, max_value=text.count(b"\n") + 1))
            cap = data.draw(st.integers(min_value=1, max_value=len(text)))
            contents.append(str(read(kernel, ref.id, startLine=line, maxBytes=cap)["content"]))
            for content in contents:
                for hidden in (path, secret):
                    assert not shows_part_of(content, hidden), (content, hidden)

        check()


def test_a_start_far_past_the_end_reads_as_the_end(tmp_path):
    with artifact_kernel(tmp_path) as kernel:
        ref = stored_unmasked(kernel, b"short artifact\n")
        outs = [read(kernel, ref.id, startByte=start) for start in (2**63 - 1, 10**30)]
    for out, start in zip(outs, (2**63 - 1, 10**30), strict=True):
        assert (out["startByte"], out["endByte"], out["eof"]) == (start, start, True)
        assert out["content"] == ""
        assert "nextByte" not in out
