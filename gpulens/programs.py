"""The program a command line names, for the subcommands that run one (`gpulens sim`, `gpulens try`)."""

from __future__ import annotations

import os
import shutil
import sysconfig

from gpulens.printable import printable

# The console scripts folder of this Python's environment (a virtual environment's bin/).
SCRIPTS = sysconfig.get_path("scripts")


def find_program(name: str) -> str | None:
    """`name`'s path: on PATH, else among the console scripts of the environment gpulens runs in, where the
    command must come from anyway (`gpulens sim`'s hook imports gpulens, a script under `gpulens try` imports
    gpulens.torch), so that `.venv/bin/gpulens sim demo -- nvitop` finds the nvitop beside it without the
    environment being activated. A name with a slash is a path, looked up as it is."""
    found = shutil.which(name)
    if found is None and os.sep not in name:
        found = shutil.which(name, path=SCRIPTS)
    return found


def not_found(name: str) -> str:
    """Return why `name` did not run and the fix, for a program `find_program` did not find."""
    return (
        f"command {printable(name)!r} not found on PATH or in {printable(SCRIPTS)}; install it in this "
        "environment or give its path"
    )


def folder(name: str) -> str:
    """Return why `name` cannot run when it is a path to a folder (a shell's 126, "Is a directory", not 127 for a
    missing command), and the fix; "" for anything else."""
    if os.sep not in name or not os.path.isdir(name):
        return ""
    return (
        f"cannot run {printable(name)!r}: it is a folder, not a program; name a program in it, or a script with "
        "its interpreter (python train.py)"
    )


def is_file_path(name: str) -> bool:
    """Whether `name` is a path to a file that is there: when `find_program` passes it over, it cannot run
    (not executable), which a shell answers with 126, not with 127 for a missing command."""
    return os.sep in name and os.path.isfile(name)


def cannot_run(name: str, error: OSError) -> str:
    """Return why the program `name` did not start (the system's `error`) and the fix."""
    return (
        f"cannot run {printable(name)!r}: {error.strerror or error}; make it executable (chmod +x) or run it "
        "through its interpreter (python train.py)"
    )
