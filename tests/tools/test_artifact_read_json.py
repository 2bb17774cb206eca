"""artifact.read masks what sits behind a JSON escape as the projection of the call did.

A large output is kept as canonical JSON, where a newline is the two characters "\\"
and "n": the "n" must not hide the secret or the path that follows it."""

from __future__ import annotations

import json
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_artifact_read_secrets import (
    FILLER,
    PLANTED,
    SEGMENTS,
    artifact_kernel,
    cuts,
    read,
    shows_part_of,
)

from toolkernel.canonical import canonical_json
from toolkernel.redaction import HOST_PATH_MASK, SECRET_MASK

AWS_KEY = "AKIAZ7Q3LMNOPQRSTUVW"
SSH_KEY = "/home/alice/.ssh/id_rsa"
# Characters JSON writes as a backslash escape, right before what must stay hidden.
ESCAPED = st.sampled_from(["\n", "\t", '"', "\\", "\r", "\b", "\f", "\x01"])


def escaped(value: str) -> str:
    """``value`` as it is written inside a JSON string."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


def test_a_key_and_a_path_after_escaped_newlines_are_masked(tmp_path):
    # The tester's case: a long multi-line output, kept as JSON by artifactize.
    text = ("x" * 100 + "\n") * 900 + f"{AWS_KEY}\n{SSH_KEY}\n" + ("x" * 100 + "\n") * 10
    data = canonical_json({"output": text})
    at = data.index(AWS_KEY.encode())
    with artifact_kernel(tmp_path) as kernel:
        ref = kernel.artifacts.put(data, media_type="application/json")
        around = read(kernel, ref.id, startByte=at - 4, endByte=at + 48)
        inside = read(kernel, ref.id, startByte=at + 2, endByte=at + 30)
    assert around["content"] == f"xx\\n{SECRET_MASK}\\n{HOST_PATH_MASK}\\nx"
    assert inside["content"] == f"{SECRET_MASK}\\n{HOST_PATH_MASK}"
    assert inside["withheld"] == {"aws-access-key": 1, "host-path": 1}


def test_a_windows_path_with_escaped_backslashes_is_masked(tmp_path):
    data = canonical_json({"output": "see C:\\Users\\alice\\secrets\\plan.docx now"})
    with artifact_kernel(tmp_path) as kernel:
        ref = kernel.artifacts.put(data, media_type="application/json")
        out = read(kernel, ref.id)
    assert out["content"] == f'{{"output":"see {HOST_PATH_MASK} now"}}'


@st.composite
def json_texts(draw: st.DrawFn) -> tuple[bytes, list[str]]:
    """A JSON artifact whose string holds secrets and host paths, each right after an
    escaped character; and the JSON-escaped forms of what must never show in part."""
    parts: list[str] = [draw(FILLER)]
    hidden: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if draw(st.booleans()):
            written, secret = draw(PLANTED)
        else:
            written = secret = "/" + "/".join(draw(SEGMENTS))
        parts += [draw(ESCAPED), written, draw(ESCAPED), draw(FILLER)]
        hidden.append(escaped(secret))
    return canonical_json({"exitCode": 0, "output": "".join(parts)}), hidden


def test_no_range_of_a_json_artifact_shows_part_of_an_escaped_secret_or_path(tmp_path):
    with artifact_kernel(tmp_path) as kernel:

        @settings(
            max_examples=120,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        @given(json_texts(), st.data())
        def check(planted: tuple[bytes, list[str]], data: st.DataObject) -> None:
            text, hidden = planted
            ref = kernel.artifacts.put(text, media_type="application/json")
            points = data.draw(cuts(len(text)))
            contents = [
                str(read(kernel, ref.id, startByte=start, endByte=end)["content"])
                for start, end in pairwise(points)
            ]
            cap = data.draw(st.integers(min_value=1, max_value=len(text)))
            contents.append(str(read(kernel, ref.id, startLine=1, maxBytes=cap)["content"]))
            for content in contents:
                for secret in hidden:
                    assert not shows_part_of(content, secret), (content, secret)

        check()
