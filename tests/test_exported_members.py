"""The public surface is a decision: every name in __all__ exists and is documented."""

import toolkernel


def test_all_is_sorted_and_complete():
    assert toolkernel.__all__ == sorted(toolkernel.__all__)
    aliases = {"Approver", "WorkspacePath"}  # type aliases carry typing's module
    for name in set(toolkernel.__all__) - aliases:
        member = getattr(toolkernel, name)
        assert member.__module__.startswith("toolkernel."), name
        assert member.__doc__, f"{name} has no docstring"


def test_public_names_do_not_leak_private_modules():
    public = {name for name in dir(toolkernel) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(toolkernel, name)).__name__ == "module"}
    assert public - modules == set(toolkernel.__all__)
