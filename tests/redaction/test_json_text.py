"""Secrets and host paths in JSON text: right after an escape (``\\n``, ``\\t``, ``\\"``,
``\\u00e9``), where the escape's letter reads as part of the word before them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from toolkernel.redaction import Redactor

AWS_ID = "AKIA" + "Z7QX3RMPLK2VB9TE"
GITHUB = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
HOST_PATH = "/home/alice/.ssh/id_rsa"
REDACTOR = Redactor(Path("/nonexistent-ws"), secrets=[])


@settings(max_examples=400, deadline=None)
@given(
    before=st.text(max_size=30),
    escape=st.sampled_from(["\n", "\t", "\r", '"', "\\", "é", "\b"]),
    secret=st.sampled_from([AWS_ID, GITHUB, HOST_PATH]),
    after=st.sampled_from(["", "\n", " tail", '"', "\t"]),
)
def test_a_secret_after_an_escape_in_json_text_is_masked(before, escape, secret, after):
    """What a tool prints of a JSON file, and how artifacts store long output: both the
    rules' start boundaries and the host-path pattern saw the escape's letter as a word
    character (``\\nAKIA…`` was left as it was)."""
    # "é/home/…" is a relative path in the decoded text as well: not a host path there.
    assume(not (escape == "é" and secret == HOST_PATH))
    text = json.dumps({"log": f"{before}{escape}{secret}{after}"}, ensure_ascii=True)
    redacted = REDACTOR.redact_text(text, Counter())
    assert secret not in redacted
    assert json.loads(redacted)  # the masks keep the JSON readable


def test_a_letter_after_an_escaped_backslash_is_still_a_letter():
    r"""``\\nAKIA…`` in JSON is a backslash, then ``nAKIA…``: no boundary before AKIA."""
    text = r'{"p": "x\\nAKIAZ7QX3RMPLK2VB9TE"}'
    assert REDACTOR.redact_text(text, Counter()) == text


def test_a_json_escapes_letter_before_a_colon_is_no_drive_letter():
    """``\\r:`` read as drive ``r:`` took the rest of the string for a Windows path and
    left a lone backslash before the mask: the JSON no longer parsed (found by the
    property test above, with ``before='\\r:\\x1f'``)."""
    text = json.dumps({"log": f"\r:\x1f\n{AWS_ID}"})
    redacted = REDACTOR.redact_text(text, Counter())
    assert json.loads(redacted) == {"log": "\r:\x1f\n[REDACTED]"}
    assert REDACTOR.redact_text(r"cwd C:\Users\alice", Counter()) == "cwd <host-path>"


def test_host_paths_written_with_escaped_slashes_are_masked_as_plain_ones():
    """PHP's json_encode writes "/" as "\\/" by default; the same paths unescaped were
    already made workspace-relative or masked."""
    workspace = Path("/tmp/t3/ws_p2")
    redactor = Redactor(workspace)
    value = {
        "cwd": str(workspace),
        "src": f"{workspace}/src/app.py",
        "cfg": "/etc/ssl/private/server.key",
        "log": "boot\n/var/log/app/boot.log",
        "uri": "file:///home/alice/notes.txt",
    }
    plain = json.dumps(value)
    escaped = plain.replace("/", "\\/")
    counts: Counter[str] = Counter()
    out = redactor.redact_text(escaped, counts)
    assert json.loads(out) == json.loads(redactor.redact_text(plain, Counter()))
    assert json.loads(out) == {
        "cwd": ".",
        "src": "src/app.py",
        "cfg": "<host-path>",
        "log": "boot\n<host-path>",
        "uri": "file://<host-path>",
    }
    assert counts == Counter({"host-path": 3, "workspace-path": 2})


@pytest.mark.parametrize(
    "text",
    [
        '{"url": "https:\\/\\/example.com\\/api\\/v1"}',  # a URL's path is no host path
        '{"rel": "src\\/app\\/main.py"}',  # relative
        "const re = /^https?:\\/\\/[a-z]+\\/x$/;",  # a JavaScript regex
        '{"cmd": "ls -la \\/"}',  # the root alone
    ],
)
def test_escaped_slashes_that_are_no_host_path_are_left_alone(text):
    assert REDACTOR.redact_text(text, Counter()) == text
