"""Tests for the workspace path guard: one test group per rule, properties, corpora."""

from __future__ import annotations

import os
import posixpath
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkernel.codes import ErrorCode
from toolkernel.errors import UsageError
from toolkernel.pathguard import (
    DEFAULT_FORBIDDEN,
    MAX_PATH_LENGTH,
    GuardedPath,
    PathGuard,
    PathViolation,
)

PATH_CODES = frozenset(
    {
        ErrorCode.INVALID_PATH,
        ErrorCode.ABSOLUTE_PATH,
        ErrorCode.PATH_TRAVERSAL,
        ErrorCode.SYMLINK_ESCAPE,
        ErrorCode.FORBIDDEN_PATH,
    }
)
CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
TRAVERSAL_CORPUS = CORPORA / "path-traversal"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace with a secret file right next to it, outside."""
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / ".env").write_text("TOKEN=x\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    return root


@pytest.fixture
def guard(workspace: Path) -> PathGuard:
    return PathGuard(workspace)


def code_of(result: GuardedPath | PathViolation) -> ErrorCode | None:
    return result.code if isinstance(result, PathViolation) else None


def accepted(result: GuardedPath | PathViolation) -> GuardedPath:
    assert isinstance(result, GuardedPath), result
    return result


def assert_safe(guard: PathGuard, value: str, result: GuardedPath | PathViolation) -> None:
    """The invariants every answer of the guard must hold."""
    if isinstance(result, PathViolation):
        assert result.code in PATH_CODES
        return
    root = guard.workspace
    real = Path(os.path.realpath(root / result.relative))
    assert result.absolute == real
    assert real.is_relative_to(root)
    assert ".." not in real.parts  # fully resolved, not a loop realpath gave up on
    assert not guard.is_forbidden(result.relative)
    assert not guard.is_forbidden(real.relative_to(root).as_posix())
    # The value as written, read with "\" as a separator, must land inside too.
    as_written = Path(os.path.realpath(f"{root}/{value.replace(chr(92), '/')}"))
    assert as_written.is_relative_to(root)
    assert guard.check(result.relative) == result


# --- construction -------------------------------------------------------------------


def test_workspace_is_resolved_once(tmp_path: Path, workspace: Path) -> None:
    link = tmp_path / "link-to-ws"
    link.symlink_to(workspace)
    assert PathGuard(link).workspace == workspace.resolve()


def test_missing_workspace_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        PathGuard(tmp_path / "missing")


def test_default_forbidden_covers_the_required_patterns() -> None:
    required = {".git/**", ".git", ".env", ".env.*", "*.pem", "*.key", "id_rsa*"}
    required |= {"id_ed25519*", ".ssh/", ".aws/", ".netrc", ".npmrc", ".pypirc", ".toolkernel/"}
    assert required <= set(DEFAULT_FORBIDDEN)


# --- rule 1: INVALID_PATH --------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "",
        "a" * (MAX_PATH_LENGTH + 1),
        "a\x00b",
        "a\nb",
        "tab\there",
        "\x1f",
        "a\x7f",
        "\x85",
        "\ud800",
    ],
)
def test_unusable_strings_are_invalid_paths(guard: PathGuard, value: str) -> None:
    assert code_of(guard.check(value)) is ErrorCode.INVALID_PATH


def test_a_path_of_exactly_the_maximum_length_is_usable(guard: PathGuard) -> None:
    value = "a/" * (MAX_PATH_LENGTH // 2)
    assert len(value) == MAX_PATH_LENGTH
    assert_safe(guard, value, accepted(guard.check(value)))


def test_a_non_string_is_an_invalid_path(guard: PathGuard) -> None:
    assert code_of(guard.check(42)) is ErrorCode.INVALID_PATH  # type: ignore[arg-type]


# --- rule 2: ABSOLUTE_PATH -------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "/etc/passwd",
        "/",
        "\\windows\\win.ini",
        "C:\\boot.ini",
        "c:/windows",
        "C:",
        "\\\\server\\share\\x",
        "//server/share",
        "~",
        "~/.ssh/id_rsa",
        "~root/.bashrc",
        "file:///etc/passwd",
        "FILE:etc/passwd",
        "https://example.com/x",
        "./~",  # normalizes to "~"
        "a/../~/x",
        ".\\C:\\x",
    ],
)
def test_absolute_paths_are_refused(guard: PathGuard, value: str) -> None:
    assert code_of(guard.check(value)) is ErrorCode.ABSOLUTE_PATH


@pytest.mark.parametrize(
    "value",
    [
        "%2fetc%2fpasswd",
        "%252fetc",
        "%7e/x",
        "C%3a/boot.ini",
        ".%2f%7e",
        "./%7e",
        "./%2f",
        ".//%2fx",
    ],
)
def test_values_that_decode_to_absolute_paths_are_refused(guard: PathGuard, value: str) -> None:
    assert code_of(guard.check(value)) is ErrorCode.ABSOLUTE_PATH


# --- rule 3: PATH_TRAVERSAL ------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "../../../../etc/passwd",
        "..",
        "../",
        "a/../../b",
        "a/./../../b",
        "src/../../outside/secret.txt",
        "..\\..\\etc\\passwd",
        "a\\..\\..\\b",
    ],
)
def test_climbing_above_the_root_is_traversal(guard: PathGuard, value: str) -> None:
    assert code_of(guard.check(value)) is ErrorCode.PATH_TRAVERSAL


@pytest.mark.parametrize(
    "value",
    [
        "%2e%2e%2fetc%2fpasswd",  # percent-encoded
        "%2e%2e/x",
        "..%2fx",
        "%252e%252e%252fx",  # double
        "%25252e%25252e%25252fx",  # triple
        "%%32%65%%32%65/x",  # nested
        "%c0%ae%c0%ae/x",  # overlong UTF-8
        "..%c0%afx",
        "..%c1%9cx",
        "%e0%80%ae%e0%80%ae/x",
        "%f8%80%80%80%ae%f8%80%80%80%ae/x",
        "%c0%2e%c0%2e/x",  # careless decoders ignore continuation bits
        "..%c0%qfx",  # careless decoders take any letters as hex
        "%uff0e%uff0e/x",  # IIS %u
        "..%u2215x",
        "\uff0e\uff0e\uff0fx",  # fullwidth, NFKC
        "\u2025/x",  # two dot leader, NFKC
        "..\u2215x",  # division slash
        "..\u00a5x",  # yen sign: backslash in Japanese code pages
        "..%00x/..",  # NUL truncation leaves ".."
        "a/%2e%2e/%2e%2e/b",
    ],
)
def test_values_that_decode_to_traversal_are_refused(guard: PathGuard, value: str) -> None:
    assert code_of(guard.check(value)) is ErrorCode.PATH_TRAVERSAL


@pytest.mark.parametrize(
    ("value", "relative"),
    [
        ("a/../b", "b"),
        ("./src//main.py/", "src/main.py"),
        (".", "."),
        ("./", "."),
        ("src/..", "."),
        ("a\\b", "a/b"),
        ("new/dir/file.txt", "new/dir/file.txt"),
        ("100%.txt", "100%.txt"),
        ("src/%41.txt", "src/%41.txt"),
        ("notes/café.md", "notes/café.md"),
        ("...", "..."),
        ("..foo", "..foo"),
        ("notes:2024.txt", "notes:2024.txt"),
    ],
)
def test_relative_paths_inside_are_accepted_normalized(
    guard: PathGuard, value: str, relative: str
) -> None:
    result = accepted(guard.check(value))
    assert result.relative == relative
    assert result.absolute == guard.workspace.joinpath(*relative.split("/")).resolve()
    assert_safe(guard, value, result)


# --- rule 4: SYMLINK_ESCAPE ------------------------------------------------------------


@pytest.mark.parametrize(
    ("link", "target", "value"),
    [
        ("etc", "/etc", "etc"),
        ("etc", "/etc", "etc/passwd"),
        ("up", "..", "up"),
        ("up", "..", "up/outside/secret.txt"),
        ("root", "/", "root/etc/passwd"),
        ("out", "../outside", "out/secret.txt"),
        ("secret", "../outside/secret.txt", "secret"),
        ("dangling", "../outside/not-yet", "dangling"),
        ("new", "../outside", "new/file-to-create.txt"),
    ],
)
def test_links_that_leave_the_workspace_are_escapes(
    guard: PathGuard, workspace: Path, link: str, target: str, value: str
) -> None:
    (workspace / link).symlink_to(target)
    assert code_of(guard.check(value)) is ErrorCode.SYMLINK_ESCAPE


def test_a_chain_of_links_that_ends_outside_is_an_escape(guard: PathGuard, workspace: Path) -> None:
    (workspace / "c").symlink_to("/etc")
    (workspace / "b").symlink_to("c")
    (workspace / "a").symlink_to("b")
    assert code_of(guard.check("a/passwd")) is ErrorCode.SYMLINK_ESCAPE


def test_dotdot_after_a_link_is_resolved_like_the_kernel_does(
    guard: PathGuard, workspace: Path, tmp_path: Path
) -> None:
    # Lexically "deep/.." is the root; the kernel follows "deep" first, then "..".
    (tmp_path / "outside" / "inner").mkdir()
    (workspace / "deep").symlink_to(tmp_path / "outside" / "inner")
    assert code_of(guard.check("deep/../secret.txt")) is ErrorCode.SYMLINK_ESCAPE


def test_a_decoded_separator_through_a_link_is_an_escape(guard: PathGuard, workspace: Path) -> None:
    (workspace / "etc").symlink_to("/etc")
    assert code_of(guard.check("etc%2fpasswd")) is ErrorCode.SYMLINK_ESCAPE


def test_links_inside_the_workspace_resolve_to_their_target(
    guard: PathGuard, workspace: Path
) -> None:
    (workspace / "code").symlink_to("src")
    result = accepted(guard.check("code/main.py"))
    assert result.relative == "code/main.py"
    assert result.absolute == workspace.resolve() / "src" / "main.py"


def test_a_link_loop_stays_inside(guard: PathGuard, workspace: Path) -> None:
    (workspace / "loop").symlink_to("loop")
    (workspace / "ping").symlink_to("pong")
    (workspace / "pong").symlink_to("ping")
    for value in ("loop", "loop/x", "ping/x"):
        assert_safe(guard, value, guard.check(value))


def test_a_loop_whose_remainder_climbs_out_is_an_escape(guard: PathGuard, workspace: Path) -> None:
    # realpath stops at the loop and applies the rest ("../..") lexically.
    (workspace / "a").symlink_to("a/../..")
    assert code_of(guard.check("a/x")) is ErrorCode.SYMLINK_ESCAPE


# --- rule 5: FORBIDDEN_PATH ------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        ".git",
        ".git/config",
        ".GIT/HEAD",
        "sub/.git/index",
        ".env",
        "sub/.env",
        ".ENV",
        ".env.local",
        "keys/server.pem",
        "tls/server.key",
        ".ssh/id_rsa",
        "id_rsa.pub",
        "backup/id_ed25519",
        ".aws/credentials",
        ".netrc",
        ".npmrc",
        ".pypirc",
        ".pgpass",
        "home/.kube/config",
        ".docker/config.json",
        ".azure/accessTokens.json",
        ".config/gcloud/credentials.db",
        ".toolkernel/ledger.db",
        ".git.",  # Windows drops trailing dots
        ".env ",  # and trailing spaces
        "%2eenv",  # a decoding consumer reads ".env"
        "\uff0eenv",  # NFKC reads ".env"
        "src/../.git/config",
    ],
)
def test_protected_paths_are_forbidden(guard: PathGuard, value: str) -> None:
    assert code_of(guard.check(value)) is ErrorCode.FORBIDDEN_PATH


@pytest.mark.parametrize(
    ("link", "target", "value"),
    [
        ("notes", ".env", "notes"),
        ("cfg", ".git", "cfg/config"),
        ("hop", "notes", "hop"),
        ("future", ".toolkernel/state.db", "future"),
    ],
)
def test_links_to_protected_paths_are_forbidden(
    guard: PathGuard, workspace: Path, link: str, target: str, value: str
) -> None:
    (workspace / "notes").symlink_to(".env")
    if link != "notes":
        (workspace / link).symlink_to(target)
    assert code_of(guard.check(value)) is ErrorCode.FORBIDDEN_PATH


def test_forbidden_globs_can_be_replaced(workspace: Path) -> None:
    guard = PathGuard(workspace, forbidden=["private/", "*.sqlite"])
    assert code_of(guard.check("private/x")) is ErrorCode.FORBIDDEN_PATH
    assert code_of(guard.check("db/app.SQLITE")) is ErrorCode.FORBIDDEN_PATH
    assert accepted(guard.check(".env")).relative == ".env"


def test_is_forbidden_answers_for_relative_paths(guard: PathGuard) -> None:
    assert guard.is_forbidden(".git/config")
    assert guard.is_forbidden("a/b/.env")
    assert guard.is_forbidden(".ssh")
    assert not guard.is_forbidden("src/main.py")
    assert not guard.is_forbidden(".")


# --- order and safe details ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("/.env\x00", ErrorCode.INVALID_PATH),
        ("/.env", ErrorCode.ABSOLUTE_PATH),
        ("../.env", ErrorCode.PATH_TRAVERSAL),
        ("%2e%2e/.env", ErrorCode.PATH_TRAVERSAL),
        ("up/.env", ErrorCode.SYMLINK_ESCAPE),
    ],
)
def test_rules_apply_in_order(
    guard: PathGuard, workspace: Path, value: str, code: ErrorCode
) -> None:
    (workspace / "up").symlink_to("..")
    assert code_of(guard.check(value)) is code


@pytest.mark.parametrize(
    "value",
    [
        "MARKER\x00",
        "/MARKER",
        "../MARKER",
        "%2e%2e/MARKER",
        "up/MARKER",
        "MARKER/.env",
        "MARKER" * 1000,
    ],
)
def test_details_never_echo_the_input_or_host_paths(
    guard: PathGuard, workspace: Path, tmp_path: Path, value: str
) -> None:
    (workspace / "up").symlink_to("..")
    result = guard.check(value)
    assert isinstance(result, PathViolation)
    assert "MARKER" not in result.detail
    assert str(tmp_path) not in result.detail
    assert "/" not in result.detail
    assert len(result.detail) < 60


# --- properties ------------------------------------------------------------------------

_TRICKY = [".", "..", "/", "\\", "%", "2e", "2f", "5c", "%2e", "%2f", "%25", "%c0%ae", "%00"]
_TRICKY += ["~", ":", "C:", "\uff0e", "\uff0f", "\uff3c", "\u2025", "\u2215", "\u00a5"]
_TRICKY += ["a", "b", "etc", "up", "in", ".env", ".git", "passwd", "é", "\u0301"]
_tricky_text = st.lists(st.sampled_from(_TRICKY), max_size=12).map("".join)


@pytest.fixture(scope="module")
def shared_guard(tmp_path_factory: pytest.TempPathFactory) -> PathGuard:
    """A workspace with links out, up and in; module-scoped, so Hypothesis may share it."""
    base = tmp_path_factory.mktemp("property")
    root = base / "ws"
    (root / "in" / "deep").mkdir(parents=True)
    (root / "etc").symlink_to("/etc")
    (root / "up").symlink_to("..")
    (root / "a").symlink_to("in/deep")
    (root / "b").symlink_to(".env")
    (base / "passwd").write_text("outside\n")
    return PathGuard(root)


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(_tricky_text, st.text(max_size=40)))
def test_every_accepted_string_stays_inside(shared_guard: PathGuard, value: str) -> None:
    assert_safe(shared_guard, value, shared_guard.check(value))


@settings(max_examples=200, deadline=None)
@given(value=_tricky_text)
def test_every_string_is_refused_or_stays_inside_for_a_decoding_consumer(
    shared_guard: PathGuard, value: str
) -> None:
    result = shared_guard.check(value)
    if isinstance(result, GuardedPath):
        for reading in downstream_readings(value):
            assert_inside_for_consumer(shared_guard.workspace, reading)


_NAMES = ["a", "b", "c", ".env", ".git", "docs"]
_LINK_TARGETS = st.one_of(
    st.sampled_from(
        [
            *(".", "..", "../..", "a/../..", "/etc", "/"),
            *("{base}/outside", "{base}/outside/secret.txt", "../outside/secret.txt"),
            *("{root}", "{root}/a", "../../outside"),
        ]
    ),
    st.lists(st.sampled_from([*_NAMES, ".."]), min_size=1, max_size=3).map("/".join),
)
_ENTRIES = st.lists(
    st.tuples(
        st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3),
        st.sampled_from(["dir", "file", "link"]),
        _LINK_TARGETS,
    ),
    max_size=12,
)
_PROBES = st.lists(
    st.tuples(
        st.lists(st.sampled_from([*_NAMES, "..", ".", "secret.txt", "x"]), min_size=1, max_size=5),
        st.sampled_from(["/", "\\"]),
    ).map(lambda probe: probe[1].join(probe[0])),
    max_size=10,
)


def build_layout(root: Path, base: Path, entries: list[tuple[list[str], str, str]]) -> list[str]:
    """Create dirs, files and links under ``root``; returns the created relative paths.

    Nothing is ever created through a link: tests may run as root, and a link to "/"
    must not turn into a write outside the temporary directory.
    """
    created = []
    for parts, kind, target in entries:
        current = root
        for part in parts[:-1]:
            current = current / part
            if current.is_symlink() or (current.exists() and not current.is_dir()):
                break
            current.mkdir(exist_ok=True)
        else:
            path = current / parts[-1]
            if path.is_symlink() or path.exists():
                continue
            if kind == "dir":
                path.mkdir()
            elif kind == "file":
                with path.open("x") as handle:
                    handle.write("data\n")
            else:
                path.symlink_to(target.format(base=base, root=root))
            created.append("/".join(parts))
    return created


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=_ENTRIES, probes=_PROBES)
def test_every_accepted_path_stays_inside_any_link_layout(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[list[str], str, str]],
    probes: list[str],
) -> None:
    # A fresh directory per example: function-scoped fixtures are not reset between them.
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as temp:
        base = Path(temp)
        root = base / "ws"
        root.mkdir()
        (base / "outside").mkdir()
        (base / "outside" / "secret.txt").write_text("secret\n")
        created = build_layout(root, base, entries)
        guard = PathGuard(root)
        suffixes = ["", "/secret.txt", "/..", "/../..", "/x/.."]
        for value in [*probes, *(path + suffix for path in created for suffix in suffixes)]:
            result = guard.check(value)
            assert_safe(guard, value, result)
            if should_be_accepted(guard, value):
                assert isinstance(result, GuardedPath), (value, result)


def should_be_accepted(guard: PathGuard, value: str) -> bool:
    """An independent oracle for plain names: inside after resolution and not protected."""
    if ".." in value.replace("\\", "/").split("/") or "\\" in value:
        return False
    root = guard.workspace
    real = Path(os.path.realpath(f"{root}/{value}"))
    if not real.is_relative_to(root) or ".." in real.parts:
        return False
    lexical = posixpath.normpath(value)
    return not guard.is_forbidden(lexical) and not guard.is_forbidden(
        real.relative_to(root).as_posix()
    )


# --- corpora ---------------------------------------------------------------------------


def downstream_readings(value: str) -> Iterator[str]:
    """How consumers that decode might read a value: urllib, up to three times, and NFKC."""
    reading = value
    for _ in range(3):
        reading = unquote(reading)
        yield reading
        yield unicodedata.normalize("NFKC", reading)
    yield unicodedata.normalize("NFKC", value)


def assert_inside_for_consumer(root: Path, reading: str) -> None:
    text = reading.partition("\x00")[0].replace("\\", "/")
    assert not text.startswith("/"), reading
    lexical = posixpath.normpath(f"{root}/{text}")
    assert Path(lexical).is_relative_to(root), reading
    assert Path(os.path.realpath(f"{root}/{text}")).is_relative_to(root), reading


@pytest.fixture(scope="module")
def payloads() -> list[tuple[str, str]]:
    """Every payload line of the traversal and file-inclusion lists, as (list, payload)."""
    if not TRAVERSAL_CORPUS.is_dir():
        pytest.skip(f"path-traversal corpus not found at {TRAVERSAL_CORPUS}")
    lists = sorted(
        path for path in TRAVERSAL_CORPUS.rglob("*.txt") if path.name != "_copyright.txt"
    )
    loaded = []
    for path in lists:
        # Some lists use CRLF line endings; strip "\r" only, spaces are part of payloads.
        for line in path.read_text(encoding="utf-8").splitlines():
            payload = line.rstrip("\r").replace("{FILE}", "etc/passwd")
            if payload:
                loaded.append((path.relative_to(TRAVERSAL_CORPUS).as_posix(), payload))
    return loaded


@pytest.fixture(scope="module")
def corpus_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[PathGuard, list[Path]]:
    """A workspace two levels deep with real targets above it, and a link out to one."""
    base = tmp_path_factory.mktemp("corpus")
    root = base / "home" / "project"
    root.mkdir(parents=True)
    targets = [base / "etc" / "passwd", base / "home" / "etc" / "passwd", base / "secret.txt"]
    targets += [base / "windows" / "win.ini", base / "boot.ini"]
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("outside\n")
    (root / "etc").symlink_to(base / "etc")
    (root / "index.php").write_text("<?php\n")
    return PathGuard(root), targets


def test_corpus_payloads_are_refused_or_stay_inside(
    corpus_site: tuple[PathGuard, list[Path]], payloads: list[tuple[str, str]]
) -> None:
    guard, targets = corpus_site
    outcomes: Counter[str] = Counter()
    naive_hits = 0
    for source, payload in payloads:
        naive = Path(os.path.realpath(f"{guard.workspace}/{payload.replace(chr(92), '/')}"))
        naive_hits += any(naive == target for target in targets)
        result = guard.check(payload)
        outcomes[code_of(result) or "ACCEPTED"] += 1
        assert_safe(guard, payload, result)
        if isinstance(result, GuardedPath):
            assert result.absolute not in targets, (source, payload)
            for reading in downstream_readings(payload):
                assert_inside_for_consumer(guard.workspace, reading)
    # The lists are what SOURCE.md describes; an empty or half-read corpus is a failure.
    assert len(payloads) > 30_000
    # A naive join really reaches the targets: the corpus exercises the guard.
    assert naive_hits > 100
    assert outcomes[ErrorCode.PATH_TRAVERSAL] > 10_000
    assert outcomes[ErrorCode.ABSOLUTE_PATH] > 5_000
    assert outcomes[ErrorCode.SYMLINK_ESCAPE] > 0
    assert outcomes["ACCEPTED"] > 0


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("../../../../etc/passwd", ErrorCode.PATH_TRAVERSAL),
        ("..\\..\\..\\boot.ini", ErrorCode.PATH_TRAVERSAL),
        ("%2e%2e%2f%2e%2e%2fetc%2fpasswd", ErrorCode.PATH_TRAVERSAL),
        ("..%252f..%252f..%252fetc%252fpasswd", ErrorCode.PATH_TRAVERSAL),
        ("%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd", ErrorCode.PATH_TRAVERSAL),
        ("/etc/passwd%00", ErrorCode.ABSOLUTE_PATH),
        ("C:\\boot.ini", ErrorCode.ABSOLUTE_PATH),
        ("etc/passwd", ErrorCode.SYMLINK_ESCAPE),
        ("etc%2fpasswd", ErrorCode.SYMLINK_ESCAPE),
        ("..%c0%af..%c0%afetc%c0%afpasswd", ErrorCode.PATH_TRAVERSAL),
        ("%uff0e%uff0e/etc/passwd", ErrorCode.PATH_TRAVERSAL),
    ],
)
def test_known_corpus_payloads_get_their_codes(
    corpus_site: tuple[PathGuard, list[Path]],
    payloads: list[tuple[str, str]],
    payload: str,
    code: ErrorCode,
) -> None:
    guard, _ = corpus_site
    assert any(payload == line for _, line in payloads), "the payload left the corpus"
    assert code_of(guard.check(payload)) is code


def test_harmless_corpus_names_are_accepted(
    corpus_site: tuple[PathGuard, list[Path]], payloads: list[tuple[str, str]]
) -> None:
    guard, _ = corpus_site
    for payload in ("wp-login.php", "admin/access_log", "config.inc.php"):
        assert any(payload == line for _, line in payloads)
        assert accepted(guard.check(payload)).absolute.is_relative_to(guard.workspace)
