"""Tests for gitignore-like glob matching over workspace-relative paths."""

from __future__ import annotations

import subprocess
from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel.errors import UsageError
from toolkernel.globs import compile_globs, literal_prefix, read_otherwise_by_ripgrep
from toolkernel.tools.search import find_rg


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        ("*.pem", "server.pem"),
        ("*.pem", "keys/deep/server.pem"),
        (".env", ".env"),
        (".env", "sub/.env"),
        ("id_rsa*", "home/.ssh/id_rsa.pub"),
        ("src/**/*.py", "src/a.py"),
        ("src/**/*.py", "src/pkg/sub/a.py"),
        (".git/**", ".git/config"),
        (".git/**", ".git/refs/heads/main"),
        (".git", ".git/config"),
        ("node_modules", "a/node_modules/x.js"),
        (".ssh/", ".ssh"),
        (".ssh/", ".ssh/id_ed25519"),
        (".ssh/", "home/.ssh/config"),
        ("/build", "build/out.o"),
        ("**/cache", "a/b/cache/x"),
        ("**/cache", "cache"),
        ("a/**/b", "a/b"),
        ("a/**/b", "a/x/y/b"),
        ("file?.txt", "file1.txt"),
        ("[abc].txt", "b.txt"),
        ("[a-c].txt", "c.txt"),
        ("[!abc].txt", "d.txt"),
        ("[]x].txt", "].txt"),
        ("\\*.txt", "*.txt"),
        ("[.txt", "[.txt"),
        ("**", "any/thing"),
        ("  *.log  ", "x.log"),
    ],
)
def test_pattern_matches_path(pattern: str, path: str) -> None:
    assert compile_globs([pattern]).matches(path)


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        ("*.pem", "server.pem.txt"),
        ("*.pem", "pem"),
        (".env", "x.env"),
        (".env", ".envrc"),
        ("src/**/*.py", "lib/src/a.py"),
        ("src/*.py", "src/pkg/a.py"),
        (".git/**", ".git"),
        (".git/**", "sub/.git/config"),
        ("/build", "sub/build"),
        ("a/**/b", "a/xb"),
        ("a/**/b", "xa/b"),
        ("file?.txt", "file/.txt"),
        ("file?.txt", "file12.txt"),
        ("a*b", "a/b"),
        ("[abc].txt", "d.txt"),
        ("[!abc].txt", "a.txt"),
        ("[!abc].txt", "x/.txt"),
        ("\\*.txt", "a.txt"),
        ("node_modules", "node_modules_old/x.js"),
    ],
)
def test_pattern_does_not_match_path(pattern: str, path: str) -> None:
    assert not compile_globs([pattern]).matches(path)


@pytest.mark.parametrize(
    ("pattern", "path"),
    [(".env", ".ENV"), ("*.pem", "KEYS/SERVER.PEM"), (".git", ".Git/HEAD"), ("[a-c].x", "B.X")],
)
def test_matching_ignores_case(pattern: str, path: str) -> None:
    assert compile_globs([pattern]).matches(path)


def test_a_set_matches_when_any_pattern_matches() -> None:
    globs = compile_globs(["*.pem", ".env"])
    assert globs.matches("a/.env")
    assert globs.matches("b.pem")
    assert not globs.matches("readme.md")
    assert globs.patterns == ("*.pem", ".env")


def test_an_empty_set_matches_nothing() -> None:
    globs = compile_globs([])
    assert not globs.matches("a")
    assert not globs.matches(".")


def test_the_root_matches_only_patterns_that_match_everything() -> None:
    assert compile_globs(["**"]).matches(".")
    assert compile_globs(["/**"]).matches(".")
    assert not compile_globs([".*", "*", "?"]).matches(".")


@pytest.mark.parametrize("pattern", ["", "   ", "/", "a//b", "[z-a]"])
def test_invalid_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(UsageError):
        compile_globs([pattern])


_SEGMENT_CHARS = st.sampled_from("abAB.-_")
# Normalized paths only: the guard never hands "." or ".." segments to a glob.
_segments = st.text(_SEGMENT_CHARS, min_size=1, max_size=4).filter(
    lambda segment: segment not in (".", "..")
)
_paths = st.lists(_segments, min_size=1, max_size=4).map("/".join)
_pattern_segments = st.text(st.sampled_from("abAB.-_*?"), min_size=1, max_size=4).filter(
    lambda segment: "**" not in segment
)


@given(pattern=_pattern_segments, path=_paths)
def test_unanchored_pattern_is_a_name_match_at_any_depth(pattern: str, path: str) -> None:
    expected = any(fnmatchcase(segment.lower(), pattern.lower()) for segment in path.split("/"))
    assert compile_globs([pattern]).matches(path) == expected


@given(pattern=st.lists(_pattern_segments, min_size=2, max_size=3), path=_paths)
def test_anchored_pattern_matches_a_leading_run_of_segments(pattern: list[str], path: str) -> None:
    parts = path.split("/")
    expected = len(parts) >= len(pattern) and all(
        fnmatchcase(part.lower(), glob.lower()) for part, glob in zip(parts, pattern, strict=False)
    )
    assert compile_globs(["/".join(pattern)]).matches(path) == expected


@given(prefix=_paths, middle=st.lists(_segments, max_size=3), name=_segments)
def test_double_star_spans_any_number_of_directories(
    prefix: str, middle: list[str], name: str
) -> None:
    path = "/".join([prefix, *middle, name])
    assert compile_globs([f"{prefix}/**/{name}"]).matches(path)


@given(
    pattern=st.lists(st.one_of(_pattern_segments, st.just("**")), min_size=1, max_size=4),
    anchor=st.booleans(),
    path=_paths,
)
def test_every_path_a_pattern_matches_lies_in_its_literal_prefix(
    pattern: list[str], anchor: bool, path: str
) -> None:
    # What a sandbox makes writable for a write scope: nothing the scope refuses.
    text = ("/" if anchor else "") + "/".join(pattern)
    prefix = literal_prefix(text)
    if prefix is None:
        assert "/" not in text
        return
    if compile_globs([text]).matches(path) and prefix:
        assert (path.lower() + "/").startswith(prefix.lower() + "/")


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        ("src/**", "src"),
        ("src/**/*.py", "src"),
        ("/docs", "docs"),
        ("docs/", None),
        ("a/b/c.txt", "a/b/c.txt"),
        ("*/x", ""),
        ("**/x", ""),
        ("*.py", None),
        ("src\\*/x", ""),
    ],
)
def test_literal_prefix(pattern: str, prefix: str | None) -> None:
    assert literal_prefix(pattern) == prefix


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="ab*?/[]{},!\\-", min_size=1, max_size=12))
def test_a_pattern_both_readers_accept_ripgrep_accepts_too(tmp_path_factory, pattern):
    # Configured paths go to ripgrep as exclusions (repo.search): a pattern the
    # configuration lets through must never make every search fail.
    try:
        compile_globs((pattern,))
    except UsageError:
        return
    if read_otherwise_by_ripgrep(pattern) is not None:
        return
    empty = tmp_path_factory.mktemp("empty")
    searched = subprocess.run(
        [find_rg(), "--files", f"--iglob=!{pattern}", str(empty)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "error parsing glob" not in searched.stderr, pattern
