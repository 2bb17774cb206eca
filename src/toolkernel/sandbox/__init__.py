"""Running commands in a bubblewrap sandbox, with limits, timeouts and tree-wide kills.

The library layer under the kernel's ``PROCESS`` and ``SANDBOX_*`` adapters::

    bwrap = find_bwrap(config.bwrap)      # SandboxUnavailable: refuse those modes
    probe(bwrap)                          # until it succeeds once; same exception
    outcome = await run_sandboxed(argv, spec, bwrap=bwrap, timeout_s=30,
                                  output_dir=call_dir, cancel=token)
    # SandboxUnavailable too, when bubblewrap never ran argv (its message says why)
"""

from toolkernel.sandbox.bwrap import (
    SandboxUnavailable,
    bwrap_argv,
    find_bwrap,
    own_home,
    probe,
)
from toolkernel.sandbox.process import (
    TERM_GRACE_S,
    OutputCallback,
    ProcessOutcome,
    RunningCallback,
    run_sandboxed,
)
from toolkernel.sandbox.spec import SandboxLimits, SandboxSpec

__all__ = [
    "TERM_GRACE_S",
    "OutputCallback",
    "ProcessOutcome",
    "RunningCallback",
    "SandboxLimits",
    "SandboxSpec",
    "SandboxUnavailable",
    "bwrap_argv",
    "find_bwrap",
    "own_home",
    "probe",
    "run_sandboxed",
]
