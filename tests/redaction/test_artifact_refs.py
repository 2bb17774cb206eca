"""A tool's artifact refs are shown to the model: every field redacted, and an id only
one the artifact store issued (the model passes it back to ``artifact.read`` as it is,
so a masked id would point nowhere)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolkernel.calls import ArtifactRef
from toolkernel.codes import ErrorCode, Status
from toolkernel.dispatch import ToolOutput
from toolkernel.errors import ToolFailed
from toolkernel.functions import tool
from toolkernel.normalize import artifactize, redact

pytestmark = pytest.mark.anyio

TOKEN = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"
AWS_ID = "AKIA" + "QYLPMN5HFIQR7XYZ"


@tool("t.made_up")
def made_up() -> Any:
    """Return a ref built by hand, with a token for an id."""
    ref = ArtifactRef(id="a_" + TOKEN, media_type="text/" + AWS_ID, description="x")
    return ToolOutput({"ok": True}, summary="done", artifacts=(ref,))


@tool("t.made_up_failure")
def made_up_failure() -> Any:
    """Fail with a ref built by hand."""
    raise ToolFailed("It broke.", artifacts=[ArtifactRef(id="a_" + TOKEN)])


@pytest.mark.parametrize("name", ["t.made_up", "t.made_up_failure"])
async def test_a_ref_whose_id_the_store_did_not_issue_is_refused_unshown(kernel_factory, name):
    kernel = kernel_factory()
    kernel.register(made_up)
    kernel.register(made_up_failure)
    result = await kernel.call(kernel.start_run(), name, {})
    assert (result.status, result.error_code) == (
        Status.FAILED,
        ErrorCode.OUTPUT_CONTRACT_VIOLATION,
    )
    assert result.artifacts == ()
    shown = json.dumps(result.projection())
    assert TOKEN[:12] not in shown
    assert "artifact ref 1 of 1 has an id the artifact store did not issue" in shown


async def test_a_ref_the_store_issued_is_shown_with_its_id_and_its_other_fields_redacted(
    kernel_factory,
):
    kernel = kernel_factory()

    @tool("t.stored")
    def stored() -> Any:
        """Return a ref the store issued, described with a secret in it."""
        ref = kernel.artifacts.put(b"full", media_type="text/plain", description=TOKEN)
        return ToolOutput({"ok": True}, summary="done", artifacts=(ref,))

    kernel.register(stored)
    result = await kernel.call(kernel.start_run(), "t.stored", {})
    assert result.status is Status.SUCCEEDED
    [ref] = result.artifacts
    assert kernel.artifacts.read(ref.id) == b"full"
    assert ref.description == "[REDACTED]"
    assert {(n.kind, n.where) for n in result.redactions} == {("github-token", "artifacts")}


async def test_a_chain_without_normalize_still_masks_a_secret_in_a_ref_id(kernel_factory):
    kernel = kernel_factory(processors=(artifactize, redact))
    kernel.register(made_up)
    result = await kernel.call(kernel.start_run(), "t.made_up", {})
    [ref] = result.artifacts
    assert (ref.id, ref.media_type) == ("[REDACTED]", "text/[REDACTED]")
    assert TOKEN[:12] not in json.dumps(result.projection())
    notices = {(n.kind, n.where): n.count for n in result.redactions}
    assert notices == {("aws-access-key", "artifacts"): 1, ("high-entropy", "artifacts"): 1}
