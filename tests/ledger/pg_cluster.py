"""A private, throwaway PostgreSQL cluster for tests and benchmarks.

The cluster lives in a new temporary directory, listens only on a unix socket in that
directory (no TCP), trusts every local login, and is stopped and deleted by
:meth:`PgCluster.stop`. PostgreSQL refuses to run as root, so under root the directory
is handed to the ``postgres`` system user and every server command runs as that user.

Missing server binaries are an error, not a skip: CI installs them
(``apt-get install postgresql``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

# Every wait is bounded: initdb takes ~1 s, start and stop well under that.
_INITDB_TIMEOUT_S: Final = 60
_PG_CTL_WAIT_S: Final = 30
_SERVER_USER: Final = "postgres"
# (directory, glob below it) pairs, searched after PATH.
_SEARCH: Final = (("/usr/lib/postgresql", "*/bin"), ("/usr/local/pgsql", "bin"), ("/usr", "bin"))

# Stops and deletes the cluster once its stdin closes: when stop() closes it, or when
# the process that started the cluster dies however it dies (a killed test run would
# otherwise leave a server running). Its own session keeps it out of a group kill.
_WATCHDOG: Final = """
import shutil, subprocess, sys
sys.stdin.read()
try:
    subprocess.run(sys.argv[2:], capture_output=True, timeout=20, check=False)
finally:
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""

# Test clusters trade crash safety for speed; a benchmark asks for the real thing.
_FAST: Final = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"


class PgClusterError(RuntimeError):
    """The cluster could not be set up; the message says what to install or read."""


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Raises:
        PgClusterError: no PostgreSQL server binaries on this machine.
    """
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    for base, pattern in _SEARCH:
        # Newest major version first: /usr/lib/postgresql/16 before /usr/lib/postgresql/15.
        candidates += sorted(Path(base).glob(pattern), key=_major_version, reverse=True)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise PgClusterError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in PATH or "
        "/usr/lib/postgresql/*/bin; install them (Debian: apt-get install postgresql)"
    )


class PgCluster:
    """One temporary cluster; ``start()`` it, use :attr:`dsn`, then ``stop()`` it.

    Args:
        durable: keep PostgreSQL's crash-safety defaults (fsync on). Tests leave it off.
    """

    def __init__(self, *, durable: bool = False) -> None:
        self.durable = durable
        self.bindir = find_bindir()
        self._as_user = _run_as_prefix()
        self.root: Path | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """A libpq DSN for the cluster's ``postgres`` database, as its superuser."""
        if self.root is None:
            raise PgClusterError("the cluster is not started")
        return f"host={self.root} port=5432 dbname=postgres user={_SERVER_USER}"

    @property
    def version(self) -> str:
        """``postgres --version`` of the binaries in use."""
        out = subprocess.run(
            [str(self.bindir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()

    def start(self) -> str:
        """Create and start the cluster; returns its DSN.

        Raises:
            PgClusterError: initdb or the server failed; the message holds their output.
        """
        # Short and under /tmp: a unix socket path is limited to ~107 bytes, and the
        # server user must be able to reach it (root's TMPDIR may be private).
        self.root = Path(tempfile.mkdtemp(prefix="tkpg-", dir="/tmp"))
        data = self.root / "data"
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self.root), *self._argv("pg_ctl", _stop(data))],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            self._give_to_server_user(self.root)
            self._run(
                "initdb",
                [
                    *("-D", str(data), "--auth=trust", f"--username={_SERVER_USER}"),
                    *("--encoding=UTF8", "--locale=C", "--no-sync"),
                ],
                timeout=_INITDB_TIMEOUT_S,
            )
            settings = f"listen_addresses = ''\nunix_socket_directories = '{self.root}'\n"
            with (data / "postgresql.conf").open("a") as conf:
                conf.write(settings + ("" if self.durable else _FAST))
            log = self.root / "server.log"
            self._run(
                "pg_ctl",
                ["-D", str(data), "-l", str(log), "-w", "-t", str(_PG_CTL_WAIT_S), "start"],
                timeout=_PG_CTL_WAIT_S + 10,
                log=log,
            )
        except BaseException:
            self.stop()
            raise
        return self.dsn

    def stop(self) -> None:
        """Stop the server at once and delete the cluster. Stopping twice is harmless."""
        root, self.root = self.root, None
        watchdog, self._watchdog = self._watchdog, None
        if root is None:
            return
        try:
            if (root / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", _stop(root / "data"), timeout=20)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            if watchdog is not None and watchdog.stdin is not None:
                watchdog.stdin.close()  # nothing left for it to do: it exits
                watchdog.wait(timeout=30)

    def _argv(self, tool: str, args: list[str]) -> list[str]:
        return [*self._as_user, str(self.bindir / tool), *args]

    def _run(self, tool: str, args: list[str], *, timeout: float, log: Path | None = None) -> None:
        try:
            done = subprocess.run(
                self._argv(tool, args), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise PgClusterError(f"{tool} did not finish in {timeout} s{_tail(log)}") from exc
        if done.returncode != 0:
            raise PgClusterError(
                f"{tool} failed ({done.returncode}): {done.stderr.strip()}{_tail(log)}"
            )

    def _give_to_server_user(self, root: Path) -> None:
        if self._as_user:
            user = pwd.getpwnam(_SERVER_USER)
            os.chown(root, user.pw_uid, user.pw_gid)

    def __enter__(self) -> PgCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _run_as_prefix() -> list[str]:
    """The command prefix that runs server commands as a non-root user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(_SERVER_USER)
    except KeyError:
        raise PgClusterError(
            f"running as root, and PostgreSQL refuses root: a '{_SERVER_USER}' system user "
            "is needed (the Debian postgresql package creates it)"
        ) from None
    if shutil.which("runuser"):
        return ["runuser", "-u", _SERVER_USER, "--"]
    if shutil.which("setpriv"):
        user = pwd.getpwnam(_SERVER_USER)
        return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
    raise PgClusterError("running as root, but neither runuser nor setpriv is available")


def _stop(data: Path) -> list[str]:
    return ["-D", str(data), "-m", "immediate", "-w", "-t", "10", "stop"]


def _major_version(bindir: Path) -> int:
    name = bindir.parent.name
    return int(name) if name.isdigit() else 0


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-20:]
    return "\nserver log:\n" + "\n".join(lines)
