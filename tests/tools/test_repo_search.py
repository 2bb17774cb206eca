"""repo.search through a real Kernel, real ripgrep and real bubblewrap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel.codes import ErrorCode, Status
from toolkernel.errors import ToolFailed
from toolkernel.redaction import SECRET_MASK, Redactor
from toolkernel.testing import make_kernel
from toolkernel.tools import Sandbox, install
from toolkernel.tools.search import PREVIEW_CHARS

pytestmark = pytest.mark.anyio

CONFIG = """
extra_forbidden_paths = ["private/**"]

[[exposure]]
tools = ["*"]
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "client").mkdir(parents=True)
    (root / "src" / "client" / "factory.py").write_text(
        "from legacy import LegacyClient\n\n\ndef make():\n    return new LegacyClient(1)\n"
    )
    (root / "src" / "app.py").write_text("x = new LegacyClient(2)\ny = new legacyclient(3)\n")
    (root / "docs").mkdir()
    (root / "docs" / "notes.md").write_text("Do not call new LegacyClient( directly.\n")
    (root / ".gitignore").write_text("build/\n")
    (root / "build").mkdir()
    (root / "build" / "generated.py").write_text("new LegacyClient(99)\n")
    (root / "server.pem").write_text("new LegacyClient( in a forbidden file\n")
    (root / "private").mkdir()
    (root / "private" / "plan.txt").write_text("new LegacyClient( in a configured forbidden dir\n")
    return root


@pytest.fixture
def kernel(ws: Path):
    kernel = make_kernel(ws, CONFIG, workspace_tools=False)
    assert install(kernel) is not None
    yield kernel
    kernel.close()


async def search(kernel, **arguments):
    return await kernel.call(kernel.start_run(), "repo.search", arguments)


async def test_search_returns_structured_matches_and_a_safe_summary(kernel):
    result = await search(kernel, query="new LegacyClient(")
    assert result.status is Status.SUCCEEDED
    out = result.structured_output
    found = {(m["path"], m["line"]) for m in out["matches"]}
    assert found == {("src/client/factory.py", 5), ("src/app.py", 1), ("docs/notes.md", 1)}
    factory = next(m for m in out["matches"] if m["path"] == "src/client/factory.py")
    assert factory["preview"] == "    return new LegacyClient(1)"
    assert factory["column"] == 12
    assert out["truncated"] is False
    assert result.safe_message == "Found 3 matches for 'new LegacyClient(' in 3 files."


async def test_the_full_rg_output_is_an_artifact(kernel):
    result = await search(kernel, query="new LegacyClient(")
    (ref,) = result.artifacts
    lines = kernel.artifacts.read(ref.id).decode().splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds.count("match") == 3
    assert kinds[-1] == "summary"


async def test_gitignored_files_are_not_searched(kernel):
    result = await search(kernel, query="LegacyClient(99)")
    assert result.structured_output["matches"] == []
    assert result.safe_message == "No matches for 'LegacyClient(99)'."


async def test_forbidden_paths_are_excluded_even_when_globs_ask_for_them(kernel):
    for globs in (None, ["*.pem", "private/**"], ["server.pem"]):
        result = await search(kernel, query="LegacyClient( in a", pathGlobs=globs)
        assert result.status is Status.SUCCEEDED
        assert result.structured_output["matches"] == [], globs
    raw = kernel.artifacts.read(result.artifacts[0].id)
    assert b"server.pem" not in raw


async def test_path_globs_restrict_the_search(kernel):
    result = await search(kernel, query="new LegacyClient(", pathGlobs=["src/**/*.py"])
    paths = {m["path"] for m in result.structured_output["matches"]}
    assert paths == {"src/client/factory.py", "src/app.py"}


async def test_case_and_regex_options(kernel):
    folded = await search(kernel, query="new legacyclient(", caseSensitive=False)
    assert len(folded.structured_output["matches"]) == 4
    regex = await search(kernel, query=r"LegacyClient\(\d\)", fixedString=False)
    assert {m["line"] for m in regex.structured_output["matches"]} == {1, 5}


async def test_max_results_cuts_and_reports_the_total(kernel):
    result = await search(kernel, query="LegacyClient", maxResults=2)
    out = result.structured_output
    assert len(out["matches"]) == 2
    assert out["truncated"] is True
    assert out["totalMatches"] == 4
    assert "Showing the first 2" in result.safe_message


async def test_an_invalid_regex_is_invalid_arguments(kernel):
    result = await search(kernel, query="(unclosed", fixedString=False)
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.SCHEMA_VIOLATION


async def test_search_arguments_are_bounded_by_the_schema(kernel):
    too_long = await search(kernel, query="x" * 501)
    assert too_long.error_code is ErrorCode.OUT_OF_BOUNDS
    extra = await search(kernel, query="x", path="/etc")
    assert extra.error_code is ErrorCode.UNKNOWN_PROPERTY
    many = await search(kernel, query="x", pathGlobs=["*"] * 21)
    assert many.status is Status.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    ("arguments", "prop", "says"),
    [
        ({"query": "a\x00b"}, "query", "NUL"),
        ({"query": "a", "pathGlobs": ["src/{"]}, "pathGlobs", "glob is not valid"),
    ],
)
async def test_a_query_or_glob_ripgrep_cannot_take_is_invalid_arguments(
    kernel, arguments, prop, says
):
    result = await search(kernel, **arguments)
    assert (result.status, result.error_code) == (
        Status.INVALID_ARGUMENTS,
        ErrorCode.SCHEMA_VIOLATION,
    )
    assert f"'{prop}'" in result.safe_message
    assert says in result.safe_message


@pytest.mark.parametrize(
    "name",
    [
        "deploy.pem.",  # trailing dots are trimmed where names are (Windows file systems)
        "\u0130d_rsa",  # dotted capital I: Python folds it to "i", ripgrep does not
        "server.\u212aey",  # the Kelvin sign, folded to "k"
    ],
)
async def test_a_file_only_the_path_guard_forbids_leaves_no_trace_in_result_or_artifact(
    kernel, ws, name
):
    # The guard forbids these names; ripgrep's exclusion globs do not see them that way.
    (ws / name).write_text("launch code ZULU NINE\n")
    (ws / "docs" / "launch.md").write_text("the launch code is not written down\n")
    result = await search(kernel, query="launch code")
    assert result.status is Status.SUCCEEDED
    out = result.structured_output
    assert [m["path"] for m in out["matches"]] == ["docs/launch.md"]
    assert (out["totalMatches"], out["filesWithMatches"]) == (1, 1)
    assert result.safe_message == "Found 1 match for 'launch code' in 1 file."
    assert result.artifacts
    run = kernel.start_run()
    for ref in result.artifacts:
        raw = kernel.artifacts.read(ref.id)
        assert b"ZULU" not in raw
        assert name.encode() not in raw
        shown = await kernel.call(run, "artifact.read", {"artifactId": ref.id})
        assert shown.status is Status.SUCCEEDED
        assert "ZULU" not in json.dumps(shown.projection())
    messages = [
        json.loads(line)
        for line in kernel.artifacts.read(result.artifacts[0].id).split(b"\n")
        if line
    ]
    assert [m["type"] for m in messages] == ["begin", "match", "end", "summary"]
    assert messages[-1]["data"]["stats"]["matched_lines"] == 1


async def test_a_timed_out_search_returns_none_of_ripgreps_unfiltered_output(kernel, monkeypatch):
    line = b'{"type":"match","data":{"path":{"text":"./deploy.pem."},"lines":{"text":"ZULU"}}}\n'
    partial = kernel.artifacts.put(line)

    async def times_out(self, argv, **kwargs):
        raise ToolFailed(
            "repo.search timed out.",
            code=ErrorCode.TIMEOUT,
            output={"stdout": {"head": line.decode(), "artifact": partial.id}},
            artifacts=[partial],
        )

    monkeypatch.setattr(Sandbox, "run", times_out)
    result = await search(kernel, query="ZULU")
    assert (result.status, result.error_code) == (Status.TIMED_OUT, ErrorCode.TIMEOUT)
    assert result.artifacts == ()
    assert "ZULU" not in json.dumps(result.projection())
    assert partial.id not in json.dumps(result.projection())


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_the_begin_scanner_finds_the_same_suspects_however_the_output_is_cut(cuts):
    """ripgrep's output reaches the scanner in chunks of any size."""
    from toolkernel.tools.search import _BeginScanner

    long_match = b'{"type":"match","data":{"lines":{"text":"' + b"x" * 3000 + b'"}}}'
    lines = [
        b'{"type":"begin","data":{"path":{"text":"./src/a.py"}}}',
        b'{"type":"match","data":{"path":{"text":"./src/a.py"},"lines":{"text":"x."}}}',
        b'{"type":"begin","data":{"path":{"text":"./keys/deploy.pem."}}}',
        b'{"type":"begin","data":{"path":{"bytes":"/w=="}}}',
        b'{"type":"begin","data":{"path":{"text":"./docs /x.md"}}}',
        long_match,
        '{"type":"begin","data":{"path":{"text":"./\u0130d_rsa"}}}'.encode(),
        b'{"type":"end","data":{"path":{"text":"./src/a.py"}}}',
    ]
    output = b"".join(line + b"\n" for line in lines)
    scanner = _BeginScanner()
    at = 0
    for cut in sorted({min(c, len(output)) for c in cuts}):
        scanner(output[at:cut])
        at = cut
    scanner(output[at:])
    assert scanner.suspects() == [lines[2], lines[3], lines[4], lines[6]]
    every = _BeginScanner(every=True)
    every(output)
    assert every.suspects() == [lines[0], lines[2], lines[3], lines[4], lines[6]]


async def test_a_configured_pattern_the_two_glob_dialects_read_apart_is_judged_by_the_guard(ws):
    """A file named with braces, forbidden with them escaped as classes (a bare brace
    is refused by the configuration: ripgrep would read it as alternatives): the file
    is neither searched nor shown."""
    config = 'extra_forbidden_paths = ["notes[{]1,2[}].txt"]\n[[exposure]]\ntools = ["*"]\n'
    (ws / "notes{1,2}.txt").write_text("launch code ZULU NINE\n")
    (ws / "docs" / "launch.md").write_text("the launch code is not written down\n")
    kernel = make_kernel(ws, config, workspace_tools=False)
    try:
        assert install(kernel) is not None
        assert kernel.guard.is_forbidden("notes{1,2}.txt")
        result = await search(kernel, query="launch code")
    finally:
        kernel.close()
    assert [m["path"] for m in result.structured_output["matches"]] == ["docs/launch.md"]
    assert "ZULU" not in str(result.projection())


def test_output_the_cap_cut_before_ripgreps_summary_is_counted_not_guessed(tmp_path):
    """Without ripgrep's closing summary, the totals are what was stored, not the
    handful of matches parsed for the result."""
    from toolkernel.artifacts import ArtifactStore
    from toolkernel.tools.search import _collect

    begin = b'{"type":"begin","data":{"path":{"text":"./src/a.py"}}}\n'
    match = (
        b'{"type":"match","data":{"path":{"text":"./src/a.py"},"lines":{"text":"hit\\n"},'
        b'"line_number":1,"submatches":[{"match":{"text":"hit"},"start":0,"end":3}]}}\n'
    )
    stored = begin + match * 5 + begin.replace(b"a.py", b"b.py") + match + b'{"type":"ma'
    store = ArtifactStore(tmp_path)
    ref = store.put(stored, media_type="application/x-ndjson", producer="call_1")
    found = _collect(
        store,
        ref,
        len(stored),
        [],
        forbidden=lambda _: False,
        keep=2,
        producer="call_1",
        redactor=Redactor(tmp_path),
    )
    assert (len(found.matches), found.total, found.files) == (2, 6, 2)


def test_a_match_line_the_cap_cut_short_is_counted_not_read(tmp_path):
    """A file with one line longer than the output cap: the matches before it come back,
    the cut line is counted (the tool used to fail with JSONDecodeError)."""
    from toolkernel.artifacts import ArtifactStore
    from toolkernel.tools.search import _collect

    begin = b'{"type":"begin","data":{"path":{"text":"./small.txt"}}}\n'
    match = (
        b'{"type":"match","data":{"path":{"text":"./small.txt"},"lines":{"text":"NEEDLE\\n"},'
        b'"line_number":1,"submatches":[{"match":{"text":"NEEDLE"},"start":0,"end":6}]}}\n'
    )
    cut = b'{"type":"match","data":{"path":{"text":"./big.txt"},"lines":{"text":"NEEDLE xxxx'
    stored = begin + match + begin.replace(b"small", b"big") + cut
    store = ArtifactStore(tmp_path)
    ref = store.put(stored, media_type="application/x-ndjson", producer="call_1")
    found = _collect(
        store,
        ref,
        len(stored),
        [],
        forbidden=lambda _: False,
        keep=50,
        producer="call_1",
        redactor=Redactor(tmp_path),
    )
    assert [m["path"] for m in found.matches] == ["small.txt"]
    assert (found.total, found.files) == (2, 2)


async def test_a_file_with_a_line_past_the_output_cap_does_not_fail_the_search(tmp_path):
    (tmp_path / "big.txt").write_bytes(b"NEEDLE " + b"x" * 200_000 + b"\n")
    (tmp_path / "small.txt").write_text("NEEDLE here\n")
    kernel = make_kernel(
        tmp_path, "[sandbox.limits]\nmax_output_bytes = 100000\n", workspace_tools=False
    )
    assert install(kernel) is not None
    try:
        result = await search(kernel, query="NEEDLE", pathGlobs=["*.txt"])
    finally:
        kernel.close()
    # Which file ripgrep reaches first varies; what matters is an answer, marked cut.
    assert result.status in (Status.SUCCEEDED, Status.PARTIAL), result.safe_message
    assert result.structured_output["truncated"] is True


async def test_counts_from_output_the_cap_cut_are_told_as_lower_bounds(tmp_path):
    """Past the output cap, ripgrep's totals are lost: the counts are of what was kept,
    and the result says so rather than give them as the whole."""
    (tmp_path / "many.txt").write_text("".join(f"line {i} TODO item\n" for i in range(5000)))
    kernel = make_kernel(
        tmp_path, "[sandbox.limits]\nmax_output_bytes = 100000\n", workspace_tools=False
    )
    assert install(kernel) is not None
    try:
        cut = await search(kernel, query="TODO", maxResults=1)
        whole = await search(kernel, query="line 42 ")
    finally:
        kernel.close()
    out = cut.structured_output
    assert 0 < out["totalMatches"] < 5000
    assert out["countsComplete"] is False
    assert f"at least {out['totalMatches']} matches" in cut.safe_message
    assert "output cap" in cut.safe_message
    assert whole.structured_output["countsComplete"] is True
    assert whole.structured_output["totalMatches"] == 1
    assert "at least" not in whole.safe_message


TOKEN = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"
PASSWORD = "S3cr3t-P4ss-2024-Vx9"


async def test_a_preview_cut_from_a_long_line_shows_nothing_of_a_secret_at_its_edges(kernel, ws):
    """A line longer than the preview is cut around the match before the kernel redacts
    the preview: a token across the cut, or a password whose keyword the cut took off,
    was shown in part (30 of a token's 40 characters)."""
    filler = ",".join(f'"k{i}":"v{i}"' for i in range(30))
    lines = []
    for gap in range(0, 200, 5):
        pad = "x" * gap
        lines.append(f'{{{filler},"password":"{PASSWORD}","p":"{pad}","MARK_b{gap}":1,{filler}}}')
        lines.append(f'{{{filler},"MARK_a{gap}":1,"p":"{pad}","token":"{TOKEN}",{filler}}}')
    (ws / "src" / "settings.json").write_text("\n".join(lines) + "\n")
    result = await search(kernel, query="MARK_", maxResults=200)
    assert result.status is Status.SUCCEEDED, result.safe_message
    previews = [m["preview"] for m in result.structured_output["matches"]]
    assert len(previews) == len(lines)
    for secret in (PASSWORD, TOKEN):
        pieces = {secret[i : i + 6] for i in range(len(secret) - 5)}
        assert not [p for p in previews if any(piece in p for piece in pieces)], secret
    assert any(SECRET_MASK in p for p in previews)
    assert all(len(p) <= PREVIEW_CHARS + 2 * len(SECRET_MASK) + 2 for p in previews)


async def test_a_file_named_like_a_forbidden_directory_is_not_shown_either(ws):
    """'.ssh/' (a default) and 'creds/' forbid the name as a file too, as the guard
    reads them; ripgrep alone would skip only directories."""
    (ws / ".ssh").write_text("new LegacyClient( in a file named .ssh\n")
    (ws / "creds").write_text("new LegacyClient( in a file named creds\n")
    (ws / "sub").mkdir()
    (ws / "sub" / "creds").write_text("new LegacyClient( in sub/creds\n")
    config = CONFIG.replace('["private/**"]', '["private/**", "creds/"]')
    kernel = make_kernel(ws, config, workspace_tools=False)
    install(kernel)
    try:
        for globs in (None, ["*"], [".ssh", "creds", "sub/creds"]):
            result = await search(kernel, query="in a file named", pathGlobs=globs)
            assert result.structured_output["matches"] == [], globs
            nested = await search(kernel, query="in sub/creds", pathGlobs=globs)
            assert nested.structured_output["matches"] == [], globs
    finally:
        kernel.close()


async def test_path_globs_that_name_a_hidden_directory_search_it(kernel, ws):
    (ws / ".github" / "workflows").mkdir(parents=True)
    (ws / ".github" / "workflows" / "ci.yml").write_text("run: new LegacyClient(7)\n")
    named = await search(kernel, query="LegacyClient(7)", pathGlobs=[".github/**"])
    assert [m["path"] for m in named.structured_output["matches"]] == [".github/workflows/ci.yml"]
    default = await search(kernel, query="LegacyClient(7)")
    assert default.structured_output["matches"] == []  # hidden files only when named


@pytest.mark.parametrize(
    ("query", "fixed"), [("def f():\n    return 1", True), (r"f\(\):\n", False)]
)
async def test_a_query_across_lines_says_a_search_matches_within_one_line(kernel, query, fixed):
    result = await search(kernel, query=query, fixedString=fixed)
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.error_code is ErrorCode.SCHEMA_VIOLATION
    assert "within one line" in result.safe_message
