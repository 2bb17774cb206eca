"""Provider-safe names: reversible, deterministic, collisions refused with both names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from toolkernel.definition import ToolDefinition
from toolkernel.errors import DefinitionError
from toolkernel.providers import NameMap, ProviderNameError, provider_name
from toolkernel.testing import make_kernel

SAFE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOLKERNEL_NAMES = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_-]{0,40}(\.[A-Za-z0-9_-]{1,40}){1,3}\Z")


def definition(name: str, version: str = "1.0") -> ToolDefinition:
    return ToolDefinition.from_dict(
        {
            "name": name,
            "version": version,
            "description": "A tool.",
            "inputSchema": {"type": "object", "additionalProperties": False},
            "executionMode": "NATIVE",
        }
    )


def test_dots_become_double_underscores() -> None:
    assert provider_name("repo.search") == "repo__search"
    assert provider_name("a.b.c") == "a__b__c"


def test_a_name_that_is_already_safe_is_unchanged() -> None:
    assert provider_name("get_weather-v2") == "get_weather-v2"


def test_names_too_long_for_providers_are_shortened_deterministically() -> None:
    long_a = "website_configuration_api.WebsiteConfigurationApi.get_website_a"
    long_b = "website_configuration_api.WebsiteConfigurationApi.get_website_b"
    mapped_a, mapped_b = provider_name(long_a), provider_name(long_b)
    assert len(mapped_a) == 64
    assert SAFE.fullmatch(mapped_a)
    assert mapped_a != mapped_b
    assert mapped_a == provider_name(long_a)


def test_the_map_reads_provider_names_back() -> None:
    names = NameMap.build([definition("repo.search"), definition("file.read")])
    assert names.provider_name("repo.search") == "repo__search"
    assert names.tool_name("repo__search") == "repo.search"
    assert names.tool_name("file__read") == "file.read"


def test_an_unknown_provider_name_is_returned_unchanged_for_the_kernel_to_refuse() -> None:
    names = NameMap.build([definition("repo.search")])
    assert names.tool_name("repo__delete") == "repo__delete"


def test_two_tools_sharing_a_provider_name_are_refused_naming_both() -> None:
    with pytest.raises(ProviderNameError) as caught:
        NameMap.build([definition("a.b__c"), definition("a__b.c")])
    error = caught.value
    assert isinstance(error, DefinitionError)
    assert error.provider == "a__b__c"
    assert {error.tool, error.other} == {"a.b__c", "a__b.c"}
    assert "a.b__c" in str(error)
    assert "a__b.c" in str(error)


def test_a_withdrawn_tool_leaves_its_provider_name_to_the_next(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path / "ws", workspace_tools=False)
    kernel.register(definition("a.b__c"), lambda: "one")
    kernel.register(definition("a.b__c", "2.0"), lambda: "one")
    kernel.unregister("a.b__c", "1.0")
    with pytest.raises(DefinitionError, match=r"collides with 'a\.b__c'"):
        kernel.register(definition("a__b.c"), lambda: "two")  # version 2.0 still holds it
    kernel.unregister("a.b__c")
    registered = kernel.register(definition("a__b.c"), lambda: "two")
    assert registered.name == "a__b.c"
    assert kernel.explain(kernel.start_run(), "a__b__c", {})["tool"] == "a__b.c"


def test_several_versions_of_one_tool_share_its_name() -> None:
    names = NameMap.build([definition("repo.search"), definition("repo.search")])
    assert names.tool_name("repo__search") == "repo.search"


@given(st.lists(TOOLKERNEL_NAMES, min_size=1, max_size=8, unique=True))
def test_every_mapped_name_is_safe_and_maps_back(tool_names: list[str]) -> None:
    assume(len({provider_name(n) for n in tool_names}) == len(tool_names))
    names = NameMap.build([definition(n) for n in tool_names])
    for name in tool_names:
        mapped = names.provider_name(name)
        assert SAFE.fullmatch(mapped)
        assert names.tool_name(mapped) == name


_SEGMENT = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True)
_DOTTED = st.lists(_SEGMENT, min_size=2, max_size=3).map(".".join)


@given(st.lists(_DOTTED, min_size=1, max_size=5, unique=True), st.data())
def test_respelling_a_message_renames_whole_tool_names_only(names: list[str], data) -> None:
    table = NameMap(to_provider={n: provider_name(n) for n in names})
    picked = data.draw(st.lists(st.sampled_from(names), max_size=6))
    joints = data.draw(st.lists(st.sampled_from([", ", " ", "'", ". ", ": "]), min_size=7))
    pairs = list(zip(joints, picked, strict=False))
    text = "".join(j + n for j, n in pairs) + "."
    assert table.respell(text) == "".join(j + provider_name(n) for j, n in pairs) + "."
    # Part of a longer name, or of a path, is not a tool name.
    for name in names:
        for longer in (
            f"{name}x",
            f"{name}.more",
            f"x{name}",
            f"src/{name}.py",
            f"{name}-1",
            f"notes/{name}",
            f"~/{name}",
            f"{name}/x",
        ):
            if longer not in names:
                assert table.respell(longer) == longer
