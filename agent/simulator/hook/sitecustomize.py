"""Started by `gpulens sim` (it puts this folder first on PYTHONPATH): simulate the driver, then hand over
to any sitecustomize this folder hides."""

import importlib.machinery
import importlib.util
import os
import sys


def _simulate() -> None:
    try:
        from gpulens.agent.simulator.run import install_from_environment
    except ImportError as error:
        sys.stderr.write(
            f"gpulens sim: this Python cannot import gpulens ({error}); run the command from the "
            "environment gpulens is installed in\n"
        )
        return
    try:
        install_from_environment()
    except ImportError as error:
        if error.name != "pynvml":
            raise
        # A program without nvidia-ml-py has no NVML calls to answer.
    except Exception as error:  # noqa: BLE001 - a broken simulation must say so once and let the program run
        sys.stderr.write(f"gpulens sim: the simulated driver could not be installed: {error}\n")


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    others = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_simulate()
_chain()
