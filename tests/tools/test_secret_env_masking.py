"""``[sandbox] secret_env`` values are masked in every call's result from the start,
not only once a sandboxed tool has run: they are in the process's environment, where
any tool (or bridged server) can read them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkernel.codes import Status
from toolkernel.functions import tool
from toolkernel.kernel import Kernel
from toolkernel.redaction import SECRET_MASK
from toolkernel.testing import make_kernel
from toolkernel.tools import SandboxSettings, install

SECRET = "Tr0ub4dor&3x-db-passphrase"
EXPOSE_ALL = """
[[exposure]]
tools = ["*"]
"""
CONFIG = (
    EXPOSE_ALL
    + """
[sandbox]
secret_env = ["DB_PASS"]
"""
)


@tool("db.settings")
def db_settings() -> dict[str, str]:
    """Report the connection settings, as a tool that echoes its environment would."""
    return {"dsn": "connected as app with " + os.environ.get("DB_PASS", "<unset>")}


def first_call_sees(kernel: Kernel) -> str:
    """What the model sees of ``db.settings``, called before any sandboxed tool."""
    kernel.register(db_settings)
    result = kernel.call_sync(kernel.start_run(), "db.settings", {})
    assert result.status is Status.SUCCEEDED, result.safe_message
    assert [notice.kind for notice in result.redactions] == ["known-secret"]
    return json.dumps(result.projection())


@pytest.fixture
def db_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DB_PASS", SECRET)


@pytest.fixture
def kernels() -> Iterator[list[Kernel]]:
    opened: list[Kernel] = []
    yield opened
    for kernel in opened:
        kernel.close()


def test_a_secret_env_value_is_masked_in_a_native_tool_before_any_sandboxed_call(
    tmp_path: Path, db_pass: None, kernels: list[Kernel]
) -> None:
    kernel = make_kernel(tmp_path / "ws", CONFIG)
    kernels.append(kernel)
    shown = first_call_sees(kernel)
    assert SECRET not in shown
    assert f"connected as app with {SECRET_MASK}" in shown


def test_install_masks_the_secret_env_values_of_the_settings_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels: list[Kernel]
) -> None:
    kernel = make_kernel(tmp_path / "ws", EXPOSE_ALL, workspace_tools=False)
    kernels.append(kernel)
    install(kernel, SandboxSettings(secret_env={"DB_PASS": SECRET}))
    monkeypatch.setenv("DB_PASS", SECRET)  # set after install: the kernel has its value
    assert SECRET not in first_call_sees(kernel)


def test_a_kernel_without_the_workspace_tools_masks_the_secret_env_values_too(
    tmp_path: Path, db_pass: None, kernels: list[Kernel]
) -> None:
    kernel = make_kernel(tmp_path / "ws", CONFIG, workspace_tools=False)
    kernels.append(kernel)
    shown = first_call_sees(kernel)
    assert SECRET not in shown
    assert f"connected as app with {SECRET_MASK}" in shown
