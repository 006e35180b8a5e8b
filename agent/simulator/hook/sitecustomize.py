"""Started by `gpulens sim` (it puts this folder first on PYTHONPATH): simulate the driver, then hand over
to any sitecustomize this folder hides.

A Python that cannot be put on the simulated node (it cannot import gpulens, or the simulated driver
fails to install) says why in one line and exits with 126, what a shell returns for a command it cannot
run: run on, it would read the real node's NVML (or none) and its exit code would say all went well."""

import importlib.machinery
import importlib.util
import os
import sys

EXIT_CANNOT_RUN = 126  # gpulens.agent.simulator.run.EXIT_CANNOT_RUN: this file cannot import it


def _refuse(why: str) -> None:
    sys.stderr.write(f"gpulens sim: {why}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT_CANNOT_RUN)  # SystemExit would be reported as a failing sitecustomize, and the program run


def _simulate() -> None:
    try:
        from gpulens.agent.simulator.run import install_from_environment
    except ImportError as error:
        _refuse(
            f"{sys.executable} cannot import gpulens ({error}), so it cannot run on the simulated node; "
            "run the command with the Python of the environment gpulens is installed in"
        )
        return
    try:
        install_from_environment()
    except ImportError as error:
        if error.name != "pynvml":
            raise
        # A program without nvidia-ml-py has no NVML calls to answer.
    except Exception as error:  # noqa: BLE001 - whatever broke, the program must not run off the node
        _refuse(f"the simulated driver could not be installed ({error}); the command did not run")


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    others = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_simulate()
_chain()
