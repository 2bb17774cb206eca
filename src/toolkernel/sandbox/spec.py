"""What a sandboxed command may touch and consume: `SandboxSpec` and `SandboxLimits`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

__all__ = ["SandboxLimits", "SandboxSpec"]

_GIB = 1024**3
_MIB = 1024**2


@dataclass(frozen=True)
class SandboxLimits:
    """Resource ceilings for one command and everything it starts.

    Attributes:
        cpu_seconds: ``RLIMIT_CPU``, per process (the kernel has no per-tree CPU rlimit;
            the wall-clock timeout bounds the tree).
        memory_bytes: ``RLIMIT_AS``, address space per process.
        max_processes: ``RLIMIT_NPROC``, a ceiling against fork bombs. Set inside
            the sandbox's user namespace, where Linux 5.14 and newer count only the
            sandbox's own processes (threads included); older kernels, and
            unsandboxed runs, count every process of the real user, so a user
            already past it cannot start a command. Root, whom ``RLIMIT_NPROC``
            does not bind, gets a pids cgroup per command instead (see
            `toolkernel.sandbox.pids`), or no command where none can be made.
        max_output_bytes: stdout plus stderr kept on disk; past it the output is
            drained and discarded, and the outcome is marked truncated.
        file_size_bytes: ``RLIMIT_FSIZE``, the largest file the command may write.
        tmp_bytes: size of the command's private ``/tmp``, a tmpfs held in the host's
            memory and outside ``memory_bytes`` (unbounded, it could take half the
            host's RAM). Needs bubblewrap 0.10 or newer (the bundled one is); an
            older one is refused, never run with an unsized ``/tmp``.
    """

    cpu_seconds: int = 60
    memory_bytes: int = 2 * _GIB
    max_processes: int = 256
    max_output_bytes: int = 64 * _MIB
    file_size_bytes: int = 1 * _GIB
    tmp_bytes: int = 512 * _MIB

    def __post_init__(self) -> None:
        for name in (
            "cpu_seconds",
            "memory_bytes",
            "max_processes",
            "max_output_bytes",
            "file_size_bytes",
            "tmp_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive")


@dataclass(frozen=True)
class SandboxSpec:
    """How one command runs: its view of the filesystem, network, environment and limits.

    The workspace is mounted at its own absolute path inside the sandbox, so paths in
    the command's output (tracebacks, compiler errors) are the host paths the kernel
    already knows and can map, redact or relativise; a virtualenv inside the workspace
    keeps working because its scripts' shebangs are absolute.

    Attributes:
        workspace: Absolute host directory the command works in.
        writable: Mount the workspace read-write (``SANDBOX_WRITE``, ``PROCESS``) or
            read-only (``SANDBOX_READ_ONLY``).
        network: Share the host network namespace; otherwise the sandbox has only its
            own, empty loopback.
        env: The complete environment of the command: nothing else enters.
        cwd: Working directory, relative to ``workspace``; must stay inside it.
        limits: Resource ceilings.
        extra_ro_binds: Host paths additionally mounted read-only at the same path
            (toolchains outside ``/usr`` that the interpreter heuristic misses).
        read_only: Paths inside the workspace mounted read-only even when the
            workspace is writable (``.git``: commands may read history, not rewrite it).
        write_dirs: With ``writable``, the only directories and files of the workspace
            the command may write (a task's write scope); ``None``: all of it.
        extra_rw_binds: Host directories outside the workspace mounted read-write at
            the same path (a private report directory the runtime reads back).
        hidden: Paths inside the workspace the command must not see: a directory
            becomes an empty tmpfs, a file an empty read-only file (the runtime's
            state directory, ``.env``, keys).
    """

    workspace: Path
    writable: bool
    network: bool = False
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str = "."
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    extra_ro_binds: Sequence[Path] = ()
    read_only: Sequence[Path] = ()
    write_dirs: Sequence[Path] | None = None
    hidden: Sequence[Path] = ()
    extra_rw_binds: Sequence[Path] = ()

    def __post_init__(self) -> None:
        if not self.workspace.is_absolute():
            raise ValueError("SandboxSpec.workspace must be an absolute path")
        # Frozen dataclass: normalise the caller's mapping once so later mutation of
        # their dict cannot change what a running command receives.
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "extra_ro_binds", tuple(self.extra_ro_binds))
        object.__setattr__(self, "extra_rw_binds", tuple(self.extra_rw_binds))
        for name in ("read_only", "hidden"):
            paths = tuple(getattr(self, name))
            if any(not p.is_relative_to(self.workspace) for p in paths):
                raise ValueError(f"SandboxSpec.{name} must lie inside the workspace")
            object.__setattr__(self, name, paths)
        self.cwd_path()

    def cwd_path(self) -> Path:
        """The absolute working directory (the same path inside and outside the sandbox).

        Raises:
            ValueError: if ``cwd`` is absolute or climbs out of the workspace.
        """
        relative = Path(self.cwd)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError("SandboxSpec.cwd must be a workspace-relative path without '..'")
        return self.workspace / relative
