"""What each redaction rule masks, what it leaves alone, and how it is counted."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

from toolkernel.canonical import canonical_json
from toolkernel.redaction import HOST_PATH_MASK, SECRET_MASK, Redactor

# Fake secrets in the documented shapes, assembled so no scanner flags this file.
GITHUB = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
AWS_ID = "AKIA" + "Z7QX3RMPLK2VB9TE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
SLACK = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
OPENAI = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb3dEf6h"
ANTHROPIC = "sk-ant-api03-" + "Xy9_wV8uT7sR6qP5oN4mL3kJ2iH1gF0eD9cB8aZ7yX6wV5u-AA"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
GOOGLE = "AIza" + "SyD3fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5b"
GITLAB = "glpat-" + "xK3mN9pQ2rS5tU8vW1yZ"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM = (
    "-----BEGIN " + "RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAvsNzmvBE2DuzO1Ix2UQ8sCbSKBcBGd9qzGtvOv3yA0bJ3AbK\n"
    "dG6vDhqk7Xn2QfWkq9sYhV3mNpL8bC4xRtZ1uE5wA7yF2gH6jK9lM3nP0qS4tU8v\n"
    "-----END " + "RSA PRIVATE KEY-----"
)


@pytest.fixture
def redactor(tmp_path: Path) -> Redactor:
    return Redactor(tmp_path / "ws")


def redacted(redactor: Redactor, text: str) -> tuple[str, Counter[str]]:
    counts: Counter[str] = Counter()
    return redactor.redact_text(text, counts), counts


@pytest.mark.parametrize(
    ("text", "secret", "kind"),
    [
        (f"remote: {GITHUB}", GITHUB, "github-token"),
        (f"aws_access_key_id = {AWS_ID}", AWS_ID, "aws-access-key"),
        (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws-secret-key"),
        (f"SLACK_BOT={SLACK}", SLACK, "slack-token"),
        (f'client = OpenAI(api_key="{OPENAI}")', OPENAI, "openai-key"),
        (f"x-api-key: {ANTHROPIC}", ANTHROPIC, "anthropic-key"),
        (f"Stripe.api_key = '{STRIPE}'", STRIPE, "stripe-key"),
        (f"maps?key={GOOGLE}&v=3", GOOGLE, "google-api-key"),
        (f"git push https://oauth2:{GITLAB}@gitlab.com/a/b.git", GITLAB, "gitlab-token"),
        (f"cookie session={JWT}; Path=/", JWT, "jwt"),
        (f"key file:\n{PEM}\nnext line", PEM, "private-key"),
        ("DB_PASSWORD=hunter2-but-longer", "hunter2-but-longer", "password-assignment"),
        ('{"password": "correct horse battery"}', "correct horse battery", "password-assignment"),
        ("secret: s3cr3t-value", "s3cr3t-value", "password-assignment"),
        ("postgres://app:Pa55w0rd!@db.internal:5432/app", "Pa55w0rd!", "url-credentials"),
        ("curl -H 'Authorization: Bearer abc.def-123_456'", "abc.def-123_456", "auth-header"),
        ("mysql -u root -p Sup3rS3cret db", "Sup3rS3cret", "password-assignment"),
        # mysql's own form: the password glued to -p, anywhere on its command line.
        ("mysql -pSup3rS3cret -u root db", "Sup3rS3cret", "password-assignment"),
        ("mysql -h db.internal -pSup3rS3cret app", "Sup3rS3cret", "password-assignment"),
        ("mysqldump -uroot -pSup3rS3cret app > x.sql", "Sup3rS3cret", "password-assignment"),
        ("mariadb -h db -p'Sup3r S3cret' app", "Sup3r S3cret", "password-assignment"),
        ("sshpass -p Sup3rS3cret ssh deploy@host", "Sup3rS3cret", "password-assignment"),
        (
            "token=9fA3kL0pQ7zX2vB8nM4cR6tY1uW5sE0dG",
            "9fA3kL0pQ7zX2vB8nM4cR6tY1uW5sE0dG",
            "secret-assignment",
        ),
        (
            "blob Zx8Qp2Lm7Rt4Vb9Nc1Kd6Hf3Gj5Sa0We8Yu2Io4Pl7 end",
            "Zx8Qp2Lm7Rt4Vb9Nc1Kd6Hf3Gj5Sa0We8Yu2Io4Pl7",
            "high-entropy",
        ),
    ],
)
def test_secret_is_masked_and_counted_by_kind(redactor, text, secret, kind):
    out, counts = redacted(redactor, text)
    assert secret not in out
    assert SECRET_MASK in out
    assert counts[kind] >= 1


@pytest.mark.parametrize(
    "text",
    [
        "commit 3f786850e387550fdab836ed7e6dc881de23001b",
        "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        '{"baseHash": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}',
        "run_id=123e4567-e89b-12d3-a456-426614174000",
        "def test_known_secret_and_host_paths_never_reach_the_projection():",
        "password = request.form.get('password')",
        "token = os.environ['API_TOKEN']",
        "tests/test_client.py::test_login PASSED",
        "keyboard_layout = 'us'",
        "see https://example.com/docs/a/b and src/app/main.py",
        # The runtime's own refusals: "is not" binds no password (README drill 1 read
        # "Property 'password' is [REDACTED] accepted").
        "Property 'password' is not accepted by repo.search.",
        "the secret is required; the password is missing",
        "mysql -p app",  # -p alone: mysql asks for the password
        "grep -pattern foo src/",
        "mkdir -p build/output",
    ],
)
def test_ordinary_output_is_left_alone(redactor, text):
    out, counts = redacted(redactor, text)
    assert out == text
    assert not counts


def test_known_secret_is_masked_plain_url_encoded_and_base64(tmp_path):
    secret = "tk-Live/9x+Secret=="
    redactor = Redactor(tmp_path, secrets=[secret])
    basic = base64.b64encode(f"user:{secret}".encode()).decode()
    text = f"{secret} {urllib.parse.quote(secret, safe='')} Authorization: Basic {basic}"
    out, counts = redacted(redactor, text)
    assert secret not in out
    assert urllib.parse.quote(secret, safe="") not in out
    assert basic not in out
    assert counts["known-secret"] >= 2


def _lower_hex(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), text)


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda v: urllib.parse.quote(v), id="quote, '/' kept (Python's default)"),
        pytest.param(lambda v: urllib.parse.quote(v, safe=""), id="quote, nothing kept"),
        pytest.param(lambda v: urllib.parse.quote_plus(v), id="quote_plus"),
        pytest.param(lambda v: urllib.parse.urlencode({"t": v})[2:], id="urlencode"),
        pytest.param(lambda v: urllib.parse.quote(v, safe="!*'()"), id="encodeURIComponent"),
        pytest.param(lambda v: _lower_hex(urllib.parse.quote(v, safe="")), id="lowercase hex"),
        pytest.param(lambda v: _lower_hex(urllib.parse.quote(v)), id="lowercase hex, '/' kept"),
    ],
)
def test_known_secret_is_masked_in_every_common_url_encoding(tmp_path, encode):
    secret = "Zq9xWv3KpL0mNt7RsB2y/+=&'(x) y"
    redactor = Redactor(tmp_path, secrets=[secret])
    encoded = encode(secret)
    out, counts = redacted(redactor, f"GET https://api.example.com/v1?token={encoded}&page=2")
    assert encoded not in out
    assert counts["known-secret"] == 1


@pytest.mark.parametrize(
    "printed",
    [
        pytest.param(lambda v: json.dumps({"db_pw": v}), id="json.dumps"),
        pytest.param(lambda v: json.dumps({"db_pw": v}, ensure_ascii=False), id="utf-8 json"),
        pytest.param(lambda v: json.dumps(v).replace("/", "\\/"), id="php json_encode"),
        pytest.param(lambda v: repr({"note": v}), id="python repr"),
    ],
)
def test_a_known_secret_is_masked_as_a_string_literal_escapes_it(tmp_path, printed):
    """``[sandbox] secret_env`` values are handed to commands, which print them as JSON
    (``jq``, ``kubectl -o json``) or as a Python repr (a dict, an assertion message):
    a quote, a backslash, a "/" or a non-ASCII letter in the value is escaped there."""
    secret = 'Zq"9!xT\\4m/W-ké8'
    out, counts = redacted(Redactor(tmp_path, secrets=[secret]), printed(secret))
    assert "Zq" not in out
    assert "ké8" not in out
    assert "k\\u00e98" not in out
    assert counts == Counter({"known-secret": 1})


def test_known_secret_added_later_is_masked(tmp_path):
    redactor = Redactor(tmp_path)
    redactor.add_secret("injected-value-42")
    out, counts = redacted(redactor, "echo injected-value-42")
    assert out == f"echo {SECRET_MASK}"
    assert counts == Counter({"known-secret": 1})


def test_workspace_paths_become_relative_and_other_host_paths_are_masked(tmp_path):
    workspace = tmp_path / "ws"
    redactor = Redactor(workspace)
    text = (
        f"edit {workspace}/src/app.py; cwd {workspace}; other {workspace}2/x.py\n"
        "config /home/alice/.config/tool/settings.json\n"
        "url https://example.com/a/b/c keep src/a/b.py and ./bin/run and ~/notes/x\n"
        r"win C:\Users\alice\secrets.txt"
    )
    out, counts = redacted(redactor, text)
    assert "edit src/app.py;" in out
    assert "cwd ." in out
    assert str(tmp_path) not in out
    assert "/home/alice" not in out
    assert "alice\\secrets" not in out
    assert "https://example.com/a/b/c" in out
    for relative in ("src/a/b.py", "./bin/run", "~/notes/x"):
        assert relative in out
    assert out.count(HOST_PATH_MASK) == 3
    assert counts["workspace-path"] == 2
    assert counts["host-path"] == 3


PYTHON_TRACE = """before
Traceback (most recent call last):
  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main
    return _run_code(code, main_globals, None,
  File "/srv/app/main.py", line 12, in <module>
    main()
    ^^^^^^
ValueError: bad input
after
"""
JAVA_TRACE = """Exception in thread "main" java.lang.IllegalStateException: boom
\tat com.example.Service.run(Service.java:42)
\tat com.example.Main.main(Main.java:7)
\tat java.base/jdk.internal.reflect.NativeMethodAccessorImpl.invoke0(Native Method)
\t... 3 more
Caused by: java.io.IOException: disk
"""
NODE_TRACE = """Error: nope
    at Object.<anonymous> (/home/u/app/index.js:3:9)
    at Module._compile (node:internal/modules/cjs/loader:1256:14)
    at /home/u/app/lib.js:10:2
done
"""


@pytest.mark.parametrize(
    ("text", "frames", "kept"),
    [
        (PYTHON_TRACE, 2, ["before", "ValueError: bad input", "after"]),
        (JAVA_TRACE, 3, ["IllegalStateException: boom", "Caused by: java.io.IOException: disk"]),
        (NODE_TRACE, 3, ["Error: nope", "done"]),
    ],
)
def test_stack_trace_is_withheld_but_the_error_line_is_kept(redactor, text, frames, kept):
    out, counts = redacted(redactor, text)
    assert f"[stack trace withheld: {frames} frames]" in out
    assert counts["stack-trace"] == 1
    for frame_file in ("Service.java", "index.js", "runpy.py"):
        assert frame_file not in out
    for line in kept:
        assert line in out


def test_json_like_values_are_redacted_keys_included(redactor):
    counts: Counter[str] = Counter()
    value = {GITHUB: [f"token {GITHUB}", 3, None], "nested": {"p": "/etc/ssl/private/key.pem"}}
    out = redactor.redact(value, counts)
    assert GITHUB not in repr(out)
    assert out["nested"]["p"] == HOST_PATH_MASK
    assert counts["github-token"] == 2


def test_non_string_keys_read_as_json_writes_them(redactor):
    # The model sees the same keys as the ledger's canonical JSON of the output.
    for value in ({True: 1, False: 2}, {None: 3}, {1.5: 4, 7.0: 5}, {7: 6}):
        assert redactor.redact(value, Counter()) == json.loads(canonical_json(value))
    assert list(redactor.redact({True: 1, None: 2}, Counter())) == ["true", "null"]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "CLASSPATH=/opt/lib/a.jar:/home/alice/.ssh/id_rsa:/home/alice/b.jar",
            f"CLASSPATH={HOST_PATH_MASK}:{HOST_PATH_MASK}:{HOST_PATH_MASK}",
        ),
        ("PATH=/usr/bin:/root/.cargo/bin", f"PATH={HOST_PATH_MASK}:{HOST_PATH_MASK}"),
        ("key:/etc/ssl/private.pem", f"key:{HOST_PATH_MASK}"),
        ("see file:///home/alice/notes.txt", f"see file://{HOST_PATH_MASK}"),
        ("https://example.com/a/b/c", "https://example.com/a/b/c"),
        ("http://host:8080/x/y and s3://bucket/k/v", "http://host:8080/x/y and s3://bucket/k/v"),
        ("git@github.com:org/repo/x", "git@github.com:org/repo/x"),
    ],
)
def test_host_paths_in_lists_and_file_uris_are_masked_and_urls_kept(redactor, text, shown):
    out, _ = redacted(redactor, text)
    assert out == shown


@pytest.mark.parametrize(
    "text",
    ["PASSWORD=set", "DB_PASSWORD=still", 'password: "now"', "--password=too", "secret = not"],
)
def test_a_word_is_still_a_secret_when_assigned(redactor, text):
    """Only "is" followed by a word of prose binds nothing; "=" and ":" still do."""
    out, counts = redacted(redactor, text)
    assert SECRET_MASK in out
    assert sum(counts.values()) == 1
