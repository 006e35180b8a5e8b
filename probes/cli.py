"""`gpulens probe` (also `python -m gpulens.probes`): measure the local GPUs and judge them.

On GPUs it enumerates them through NVML (the agent's adapter), refuses any a process holds, and runs
the kernels in this process, one GPU after the other. `--device cpu` runs the same kernels on the CPU
at small sizes; `--simulate SCENARIO` answers from a simulated node without torch or a GPU (the agent
runs that way under `gpulens agent --simulate`). torch is imported only on the paths that run kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from gpulens import thresholds
from gpulens.agent.clock import LATEST_SIMULATED
from gpulens.arguments import EXIT_USAGE, UsageError, fail, raising
from gpulens.gpus import find_spec
from gpulens.probes.child import ProbeRequest, failed
from gpulens.probes.results import ERROR, OK, SLOW, WRONG, GpuReport
from gpulens.probes.table import Progress, render

if TYPE_CHECKING:  # these import torch or pynvml: only the paths that probe import them
    from gpulens.agent.nvml import GpuIdentity, Nvml
    from gpulens.probes.kernels import Matmul
    from gpulens.probes.runner import Memory, Settings

EXIT_OK = 0
EXIT_SLOW = 1
EXIT_WRONG = 3
EXIT_UNPROBED = 4
MAX_SIMULATE_TIME = LATEST_SIMULATED  # seconds

EPILOG = f"""exit status:
  0  every GPU probed, every judged result at or above --min-peak-ratio
  1  a judged result (device copy, pinned host copy, matmul) is below --min-peak-ratio of its peak
  2  a mistake on the command line
  3  a result is WRONG: a product differs from its float64 reference or a copy from its source
     (takes precedence over 1 and 4)
  4  a GPU could not be probed: in use, a process appeared mid-probe, out of time, a failure, MIG mode,
     a GPU NVML cannot read (the others are still probed), or no driver or no GPU

Judged results are the device copy, pinned host copies and the matmuls; pageable and peer copies are
reported but not judged. Default threshold {thresholds.PROBE_MIN_PEAK_RATIO:g} (gpulens/thresholds.py).
"""


class Unavailable(RuntimeError):
    """Nothing can be probed here (no driver, no GPU); the message says what to do instead."""


_Parser = raising(UsageError, "gpulens probe")  # one line, not a usage dump


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpulens probe",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description="Measure each free local GPU (copies and matmuls) against its datasheet.",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda: every free local GPU (default); cpu: the same kernels on the CPU, small sizes",
    )
    p.add_argument("--gpu", metavar="LIST", help="only these GPUs: NVML indexes or UUIDs, comma-separated")
    p.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    p.add_argument(
        "--min-peak-ratio",
        type=float,
        metavar="R",
        default=thresholds.PROBE_MIN_PEAK_RATIO,
        help=f"a judged result below R x its peak exits 1 (default {thresholds.PROBE_MIN_PEAK_RATIO:g})",
    )
    p.add_argument(
        "--time-budget", metavar="DURATION", default="60s", help="stop probing a GPU after this long (default 60s)"
    )
    p.add_argument(
        "--memory-fraction",
        type=float,
        metavar="F",
        default=0.5,
        help="use at most F of the memory free at start, on the device and on the host (default 0.5)",
    )
    p.add_argument("--matmul-size", type=int, metavar="N", help="n of the n x n x n products (default 8192, CPU 512)")
    p.add_argument("--copy-mib", type=int, metavar="MIB", help="MiB per copy buffer (default 256, CPU 32)")
    p.add_argument("--repeats", type=int, metavar="N", help="timed repeats per probe; the median counts (default 10)")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip the GPU-to-GPU copy")
    p.add_argument(
        "--simulate",
        metavar="SCENARIO",
        help="probe a simulated node (a built-in scenario or a YAML file): no torch, no GPU",
    )
    p.add_argument(
        "--simulate-time",
        type=float,
        metavar="SECONDS",
        default=0.0,
        help="with --simulate, the scenario time at which the probe starts (default 0)",
    )
    return p


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Return the validated options; raise UsageError naming the bad one."""
    from gpulens.units import UnitError, parse_duration

    options = build_parser().parse_args(list(argv))
    try:
        options.time_budget = parse_duration(options.time_budget, "--time-budget")
    except UnitError as error:
        raise UsageError(str(error)) from None
    checks = (
        (0 <= options.min_peak_ratio <= 1, "--min-peak-ratio must be between 0 and 1, e.g. 0.5"),
        (1 <= options.time_budget <= 3600, "--time-budget must be between 1s and 1h"),
        (0 < options.memory_fraction <= 1, "--memory-fraction must be above 0 and at most 1, e.g. 0.5"),
        (options.matmul_size is None or 64 <= options.matmul_size <= 65536, "--matmul-size must be 64 to 65536"),
        (options.copy_mib is None or 1 <= options.copy_mib <= 65536, "--copy-mib must be 1 to 65536"),
        (options.repeats is None or 1 <= options.repeats <= 1000, "--repeats must be 1 to 1000"),
        (
            not (options.simulate and options.device == "cpu"),
            "--simulate and --device cpu exclude each other; pick one",
        ),
        # The simulator steps through every 1/6 s up to that time (a day takes half a second per GPU):
        # a time of 1e300 s would never end, and infinity cannot be stepped to.
        (0 <= options.simulate_time <= MAX_SIMULATE_TIME, "--simulate-time must be 0 to 31622400 seconds (366 days)"),
        (
            not options.simulate_time or options.simulate,
            "--simulate-time applies to --simulate; add it or drop --simulate-time",
        ),
        (not (options.gpu and options.device == "cpu"), "--gpu chooses GPUs; drop it with --device cpu"),
        # Blank, it would choose nothing and so probe every GPU, which leaving --gpu out says on purpose.
        (
            options.gpu is None or any(item.strip() for item in options.gpu.split(",")),
            "--gpu names no GPU; give indexes or UUIDs, e.g. --gpu 0,1, or leave it out for every GPU",
        ),
    )
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    return options


def main(
    argv: Sequence[str] | None = None,
    *,
    multiply: Matmul | None = None,
    library: Any = None,
    memory: Memory | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run `gpulens probe`; return the exit status. `multiply`, `library` (a pynvml-compatible NVML) and
    `memory` (free bytes) replace the real ones, for tests."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        progress = Progress(stderr)
        if options.simulate:
            reports = _simulated(options)
        elif options.device == "cpu":
            reports = _cpu(options, multiply, memory, progress)
        else:
            reports = _gpus(options, multiply, library, memory, progress)
    except UsageError as error:
        return fail("gpulens probe", error, EXIT_USAGE, stderr)
    except Unavailable as error:
        return fail("gpulens probe", error, EXIT_UNPROBED, stderr)
    if options.json:
        json.dump(
            {"min_peak_ratio": options.min_peak_ratio, "reports": [r.to_dict() for r in reports]}, stdout, indent=1
        )
        stdout.write("\n")
    else:
        stdout.write(render(reports, options.min_peak_ratio))
    return exit_status(reports)


def exit_status(reports: Sequence[GpuReport]) -> int:
    """Return the exit status for these reports (see EPILOG)."""
    statuses = {r.status for r in reports}
    if WRONG in statuses:
        return EXIT_WRONG
    if SLOW in statuses:
        return EXIT_SLOW
    if not reports or statuses - {OK}:
        return EXIT_UNPROBED
    return EXIT_OK


def _settings(options: argparse.Namespace, device: str) -> Settings:
    from gpulens.probes.plan import CPU_PLAN, GPU_PLAN, MIB
    from gpulens.probes.runner import Settings

    plan = GPU_PLAN if device == "cuda" else CPU_PLAN
    if options.matmul_size:
        plan = replace(plan, matmul_n=options.matmul_size)
    if options.copy_mib:
        plan = replace(plan, copy_bytes=options.copy_mib * MIB, host_bytes=options.copy_mib * MIB)
    if options.repeats:
        plan = replace(plan, repeats=options.repeats)
    return Settings(
        min_peak_ratio=options.min_peak_ratio,
        time_budget=options.time_budget,
        memory_fraction=options.memory_fraction,
        plan=plan,
        peer=options.peer,
    )


def _run_kwargs(multiply: Matmul | None, memory: Memory | None, progress: Progress, label: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"progress": lambda done, total, step: progress.update(label, done, total, step)}
    if multiply is not None:
        kwargs["multiply"] = multiply
    if memory is not None:
        kwargs["memory"] = memory
    return kwargs


def _runner() -> ModuleType:
    """Return the runner module, which imports torch; raise Unavailable without torch."""
    try:
        from gpulens.probes import runner
    except ImportError as error:
        raise Unavailable(f"the probes need torch ({error}); install it with pip install 'gpulens[probes]'") from None
    return runner


def _cpu(
    options: argparse.Namespace, multiply: Matmul | None, memory: Memory | None, progress: Progress
) -> list[GpuReport]:
    from gpulens.probes.safety import Budget, NoGuard

    runner = _runner()

    settings = _settings(options, "cpu")
    try:
        return [
            runner.run(
                runner.cpu_target(),
                settings,
                NoGuard(),
                Budget(settings.time_budget),
                **_run_kwargs(multiply, memory, progress, "cpu"),
            )
        ]
    finally:
        progress.close()


def _simulated(options: argparse.Namespace) -> list[GpuReport]:
    from gpulens.agent.clock import ManualClock
    from gpulens.agent.nvml import Nvml, load_simulated_library
    from gpulens.agent.simulator.scenario import ScenarioError, load_scenario
    from gpulens.probes import simulated

    try:
        scenario = load_scenario(options.simulate)
    except ScenarioError as error:
        raise UsageError(str(error)) from None
    clock = ManualClock(start=options.simulate_time, epoch=scenario.start_time)
    nvml = Nvml(load_simulated_library(scenario, clock))
    # A UUID is most likely at its scenario's index (unless an absent GPU comes before it): looked for there first.
    node = _survey(nvml, options.gpu, [g.index for g in scenario.gpus if g.uuid in _items(options.gpu)])
    surveyed = nvml  # whose handles `node` holds
    reports = []
    try:
        for index, _ in _select(node.listed(), options.gpu):
            report = _refused(node, index)
            if report is None:
                # The survey's handle, while its library is the one in use: a later node's own otherwise.
                handle = node.handles[index] if nvml is surveyed else nvml.handle(int(index))
                if clock.now != options.simulate_time:
                    # Each GPU's probe starts at --simulate-time, as it would alone (the agent probes one GPU per
                    # child), whatever the order. A simulated node's clock never goes back, as a monotonic one
                    # would not (SimulatedNode.now): a GPU probed after another gets a node of its own.
                    nvml.shutdown()
                    clock = ManualClock(start=options.simulate_time, epoch=scenario.start_time)
                    nvml = Nvml(load_simulated_library(scenario, clock))
                    nvml.init()
                    handle = nvml.handle(int(index))
                budget = options.time_budget
                ident = node.identities[index]
                report = simulated.probe(scenario, nvml, clock, ident, handle, options.min_peak_ratio, budget)
            reports.append(report)
    finally:
        nvml.shutdown()
    return reports


@dataclass(frozen=True)
class _Node:
    """The `count` GPUs NVML lists, by NVML index as text: the handle and identity of each read, and why NVML
    could not read each it could not."""

    count: int
    handles: dict[str, Any] = field(default_factory=dict)
    identities: dict[str, GpuIdentity] = field(default_factory=dict)
    unread: dict[str, str] = field(default_factory=dict)

    def listed(self) -> list[tuple[str, str]]:
        """Return (index, uuid) of every GPU in NVML's order; the uuid is "" where it was not read."""
        return [(str(i), self.identities[str(i)].uuid if str(i) in self.identities else "") for i in range(self.count)]


def _survey(nvml: Nvml, wanted: str | None, first: Sequence[int] = ()) -> _Node:
    """Initialize NVML and read the identity of each GPU `wanted` (a --gpu list; None for all) may name, those
    at the indexes `first` first; raise Unavailable when NVML is down or lists no GPU. A GPU NVML cannot read
    (lost, a call that fails) is left in `unread`: it never takes the others down. Only GPUs that may be chosen
    are read: on a simulated node, the first read of a GPU steps it to the probe's time, seconds per simulated
    day. The caller shuts NVML down."""
    from gpulens.agent.nvml import GpuLost, NvmlCallError, NvmlDown

    try:
        nvml.init()
    except NvmlDown as error:
        raise Unavailable(
            f"no NVIDIA driver answers here ({error}); 'gpulens probe --device cpu' runs the probes on the CPU instead"
        ) from None
    items = _items(wanted)
    uuids = {item for item in items if not item.isdigit()}  # read in NVML's order until each is found
    try:
        # None where NVML refused nvmlDeviceGetCount after init() succeeded: no GPU listed, as the agent reads it.
        node = _Node(nvml.device_count() or 0)
        for i in dict.fromkeys([*(i for i in first if i < node.count), *range(node.count)]):
            if items and str(i) not in items and not uuids:
                continue
            try:
                handle = nvml.handle(i)
                if handle is not None:  # None: NVML answered that it has none to give (NOT_FOUND, NO_PERMISSION)
                    node.identities[str(i)] = nvml.identity(handle, i)
                    node.handles[str(i)] = handle
                    uuids.discard(node.identities[str(i)].uuid)
                    continue
                why = "it gives no handle for it"
            except (GpuLost, NvmlCallError) as error:
                why = str(error)
            node.unread[str(i)] = f"not probed: NVML cannot read this GPU ({why}); check 'nvidia-smi'"
    except (NvmlCallError, NvmlDown) as error:
        nvml.shutdown()
        raise Unavailable(f"NVML could not list the GPUs ({error}); check 'nvidia-smi'") from None
    if not node.count:
        nvml.shutdown()
        raise Unavailable("NVML lists no GPU here; 'gpulens probe --device cpu' runs the probes on the CPU")
    return node


def _refused(node: _Node, index: str) -> GpuReport | None:
    """Return the report of a GPU that is not probed, on a real node or a simulated one: one NVML cannot read,
    or one in MIG mode; None for a GPU to probe."""
    if index in node.unread:
        return failed(ProbeRequest(int(index), "", "", at=0.0), ERROR, node.unread[index])
    if node.identities[index].mig_mode == "enabled":
        return _unprobed(node.identities[index], "MIG is enabled: probes measure whole GPUs; run them with MIG off")
    return None


def _items(wanted: str | None) -> list[str]:
    """Return the indexes and UUIDs a --gpu list names."""
    return [w.strip() for w in (wanted or "").split(",") if w.strip()]


def _select(gpus: list[tuple[str, str]], wanted: str | None) -> list[tuple[str, str]]:
    """Return the (index, uuid) pairs `wanted` names (all when None); raise UsageError for an unknown one."""
    if not wanted:
        return gpus
    chosen = []
    for item in _items(wanted):
        match = [g for g in gpus if item in g]
        if not match:
            known = ", ".join(i for i, _ in gpus) or "none"
            raise UsageError(f"--gpu {item}: no such GPU; indexes here: {known} (or give a UUID)")
        chosen += [g for g in match if g not in chosen]
    return chosen


def _gpus(
    options: argparse.Namespace, multiply: Matmul | None, library: Any, memory: Memory | None, progress: Progress
) -> list[GpuReport]:
    from gpulens.agent.nvml import Nvml, load_real_library

    nvml = Nvml(library if library is not None else load_real_library())
    node = _survey(nvml, options.gpu)
    try:
        chosen = [index for index, _ in _select(node.listed(), options.gpu)]
        return _probe_each(options, nvml, node, chosen, multiply, memory, progress)
    finally:
        nvml.shutdown()


def _probe_each(
    options: argparse.Namespace,
    nvml: Nvml,
    node: _Node,
    chosen: list[str],
    multiply: Matmul | None,
    memory: Memory | None,
    progress: Progress,
) -> list[GpuReport]:
    import time

    from gpulens.probes.safety import Budget, Guard

    runner = _runner()
    import torch

    settings = _settings(options, "cuda")
    cuda = _cuda_indexes(torch)
    reports = []
    handles, identities = node.handles, node.identities
    for index in chosen:
        refused = _refused(node, index)
        if refused is not None:
            reports.append(refused)
            continue
        ident = identities[index]
        if ident.uuid not in cuda:
            reports.append(_unprobed(ident, "CUDA does not see this GPU (check CUDA_VISIBLE_DEVICES)"))
            continue
        peer = _free_peer(nvml, node, chosen, index, cuda) if settings.peer else None
        target = runner.Target(
            gpu=index,
            uuid=ident.uuid,
            name=ident.name,
            device=f"cuda:{cuda[ident.uuid]}",
            peer=f"cuda:{cuda[identities[peer].uuid]}" if peer else None,
            pcie_generation=ident.pcie_max_generation,
            pcie_width=ident.pcie_max_width,
        )
        watched = {index: handles[index], **({peer: handles[peer]} if peer else {})}
        try:
            reports.append(
                runner.run(
                    target,
                    settings,
                    Guard(nvml, watched),
                    Budget(settings.time_budget),
                    wall=time.time,
                    **_run_kwargs(multiply, memory, progress, f"gpu {index}"),
                )
            )
        finally:
            progress.close()
    return reports


def _cuda_indexes(torch: ModuleType) -> dict[str, int]:
    """Return CUDA's device index for each GPU UUID; CUDA's order may differ from NVML's. Raise Unavailable when
    this torch has no CUDA at all, CUDA sees no GPU or the GPUs are simulated: then none can be probed."""
    why = _no_cuda(torch)
    if why:
        raise Unavailable(why)
    out = {}
    for i in range(torch.cuda.device_count()):
        uuid = str(torch.cuda.get_device_properties(i).uuid)
        out[uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"] = i
    return out


def _no_cuda(torch: ModuleType) -> str | None:
    """Return why CUDA can probe none of the GPUs NVML lists, and what to do instead, in one sentence; None when
    it may see them."""
    import shlex

    from gpulens.agent.simulator.run import ENV_SCENARIO
    from gpulens.printable import printable

    scenario = os.environ.get(ENV_SCENARIO)
    if scenario:  # `gpulens sim` puts a simulated driver under pynvml only: no kernel runs on its GPUs
        return (
            "the GPUs are simulated ('gpulens sim' simulates NVML, not CUDA); "
            f"'gpulens probe --simulate {shlex.quote(printable(scenario))}' probes the simulated node instead"
        )
    if torch.version.cuda is None:  # a CPU-only wheel, e.g. from https://download.pytorch.org/whl/cpu
        return (
            f"torch {torch.__version__} is built without CUDA; install a CUDA build "
            "(https://pytorch.org/get-started/locally/, e.g. pip install torch --index-url "
            "https://download.pytorch.org/whl/cu126), or on a machine without GPUs run "
            "'gpulens probe --simulate SCENARIO'"
        )
    if torch.cuda.is_available():
        return None
    # torch.cuda.is_available() is false when CUDA_VISIBLE_DEVICES hides every GPU, or when the driver is older
    # than the CUDA runtime torch was built with.
    return (
        f"CUDA {torch.version.cuda} (torch {torch.__version__}) sees no GPU though NVML lists them; check "
        f"CUDA_VISIBLE_DEVICES and that the driver supports CUDA {torch.version.cuda} ('nvidia-smi' shows the "
        "newest it does)"
    )


def _free_peer(nvml: Nvml, node: _Node, chosen: list[str], index: str, cuda: dict[str, int]) -> str | None:
    """Return the next chosen GPU after `index` that no process holds now, for the peer copy, or None."""
    from gpulens.agent.nvml import GpuLost, NvmlCallError

    order = chosen[chosen.index(index) + 1 :] + chosen[: chosen.index(index)]
    for other in order:
        if _refused(node, other) is not None or node.identities[other].uuid not in cuda:
            continue
        try:
            processes = nvml.processes(node.handles[other])
        except (GpuLost, NvmlCallError):
            continue  # a GPU lost since the survey is no peer; its own probe reports it
        # This process may already hold a context there, from probing that GPU before.
        if processes is not None and all(p.pid == os.getpid() for p in processes):
            return other
    return None


def _unprobed(ident: GpuIdentity, detail: str) -> GpuReport:
    spec = find_spec(ident.name)  # a known model is named as such, though not measured
    report = failed(ProbeRequest(ident.index, ident.uuid, ident.name, at=0.0), ERROR, detail)
    return replace(report, spec=spec.model if spec else "")
