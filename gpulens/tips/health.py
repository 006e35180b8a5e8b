"""Tips for a GPU that is broken or slowed down: lost from the bus, memory errors, Xids, throttled clocks
and a degraded PCIe link."""

from __future__ import annotations

from gpulens.tips.evidence import Facts, pcie_bandwidth
from gpulens.tips.tip import DCGM_FEATURES, NVSMI, Family, always, said, this_gpu
from gpulens.vocabulary import Condition, Reason
from gpulens.words import join, percent, plural

# Xid codes seen most on compute nodes: (meaning, what to do). From NVIDIA's Xid catalog and GPU debug
# guidelines (docs.nvidia.com/deploy/xid-errors, docs.nvidia.com/deploy/gpu-debug-guidelines).
XID_MEANINGS: dict[int, tuple[str, str]] = {
    13: (
        "graphics engine exception",
        "usually the application (an out-of-range access or illegal instruction); rerun it under "
        "`compute-sanitizer`; if different jobs hit it on this GPU, drain it and run `dcgmi diag -r 3`",
    ),
    31: (
        "GPU memory page fault",
        "usually an illegal memory access by the application; rerun with `CUDA_LAUNCH_BLOCKING=1` to find "
        "the kernel; if different jobs hit it on this GPU, suspect the driver or the hardware",
    ),
    43: (
        "GPU stopped processing",
        "the application hit a fault and its channel was reset; the GPU itself is fine, so fix and restart the job",
    ),
    45: (
        "preemptive cleanup",
        "the driver cleaned up after an earlier error or a killed process; read the Xid logged before it",
    ),
    48: (
        "double-bit ECC error",
        "an uncorrectable memory error; drain the node, reset the GPU, and check ECC counts and remapped rows",
    ),
    61: (
        "internal micro-controller breakpoint or warning",
        "reset the GPU; if it recurs, update the driver and collect `nvidia-bug-report.sh`",
    ),
    62: (
        "internal micro-controller halt",
        "reset the GPU; if it recurs, update the driver and collect `nvidia-bug-report.sh`",
    ),
    63: (
        "ECC page retirement or row remap recorded",
        "the repair takes effect at the next GPU reset; drain and reset when convenient",
    ),
    64: (
        "ECC page retirement or row remap failed",
        "the memory could not be repaired; drain the node, run `dcgmi diag -r 3`, and RMA if it repeats",
    ),
    74: (
        "NVLink error",
        "check `nvidia-smi nvlink -e` for the failing link, reset the GPU, and reseat or replace the NVLink "
        "bridge or board if it repeats",
    ),
    79: (
        "GPU has fallen off the bus",
        "drain the node, check power, PCIe seating and temperatures, then reboot; RMA if it happens again",
    ),
    92: (
        "high single-bit ECC error rate",
        "the memory is degrading; schedule a reset and watch remapped rows and uncorrectable errors",
    ),
    94: (
        "contained ECC error",
        "only the application that touched the bad memory was stopped; restart it, and reset the GPU when "
        "convenient so the row is remapped",
    ),
    95: ("uncontained ECC error", "every application on the GPU is affected; drain the node and reset the GPU"),
    119: (
        "GSP RPC timeout",
        "the GPU's system processor stopped answering; reset the GPU and update the driver if it recurs",
    ),
    120: (
        "GSP error",
        "the GPU's system processor reported an error; reset the GPU and update the driver if it recurs",
    ),
}

# Xids that newer drivers often fix: micro-controller and GSP faults.
_DRIVER_XIDS = frozenset({61, 62, 119, 120})

_XID = "https://docs.nvidia.com/deploy/xid-errors/index.html"
_XID_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
_DEBUG_GUIDE = "https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html"
_DCGM_DIAG = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html"
_MEM_ERRORS = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"

family = Family()


@family.tip(
    id="gpu_fell_off_bus",
    title="Drain the node and recover the lost GPU",
    applies_to=(Reason.GPU_LOST.value, Condition.LOST.value),
    docs=(_XID_CATALOG, _DEBUG_GUIDE),
    when="the GPU stopped answering (NVML lost it, Xid 79)",
    reads=("model",),
    score=always(95),
)
def _lost_text(f: Facts) -> str:
    model = f.text("model")
    observed = f"this {model} no longer answers on the PCIe bus" if model else ""
    advice = (
        "jobs on the GPU have failed. Drain the node, collect `nvidia-bug-report.sh`, and check power cables, "
        "power supplies, PCIe seating and temperatures; a reboot usually brings the GPU back, and one that "
        "falls off the bus again (Xid 79) needs an RMA"
    )
    return said(observed, advice, "the GPU has fallen off the bus: ")


@family.tip(
    id="gpu_unreadable",
    title="Find out why every NVML call on the GPU fails",
    applies_to=(Reason.GPU_UNREADABLE.value,),
    docs=(NVSMI, _DEBUG_GUIDE),
    when="the GPU is still listed but every NVML call on it failed this cycle",
    reads=(),
    score=always(90),
)
def _unreadable_text(f: Facts) -> str:
    return (
        "The GPU is still listed, but every NVML call on it failed, so nothing about its use can be known; "
        "the agent's log and its read-error counts name each failing call and its error. Run "
        '`nvidia-smi -q -i INDEX` on the node: "Unknown Error" or ERR! fields mean the GPU needs a reset '
        "(`nvidia-smi -r -i INDEX` once its jobs are gone) or the node a reboot; check the kernel log for an "
        "Xid, and if it comes back after a reset, collect `nvidia-bug-report.sh`."
    )


@family.tip(
    id="ecc_uncorrected",
    title="Drain the node and reset the GPU",
    applies_to=(Condition.ECC_UNCORRECTED.value,),
    docs=(_MEM_ERRORS, _DEBUG_GUIDE, _DCGM_DIAG),
    when="uncorrectable ECC errors since the driver loaded",
    reads=("ecc_uncorrected", "xid"),
    score=always(90),
)
def _ecc_text(f: Facts) -> str:
    errors, xid = f.count("ecc_uncorrected"), f.count("xid")
    seen = []
    if errors:
        seen.append(f"{plural(errors, 'uncorrectable ECC error')} since the driver loaded")
    if xid in (48, 94, 95):
        seen.append(f"the last Xid was {xid} ({XID_MEANINGS[xid][0]})")
    advice = (
        "jobs that touched the bad memory were stopped. Drain the node, reset the GPU (`nvidia-smi -r -i "
        "<index>`) or reboot so the bad rows are remapped, then run `dcgmi diag -r 3` before returning it to "
        "service; repeated uncorrectable errors or a failed remap mean an RMA (attach `nvidia-bug-report.sh`)"
    )
    return said(join(seen), advice, "uncorrectable ECC errors: ")


@family.tip(
    id="row_remap",
    title="Reset to apply row remaps; RMA when remapping fails",
    applies_to=(Condition.ROW_REMAP_FAILURE.value,),
    docs=(_MEM_ERRORS, _DEBUG_GUIDE),
    when="a row remap is pending or has failed",
    reads=("row_remap_pending", "row_remap_failure"),
    score=always(90),
)
def _remap_text(f: Facts) -> str:
    pending, failed = f.flag("row_remap_pending"), f.flag("row_remap_failure")
    if failed:
        return (
            "Row remapping failed: the memory bank has no spare row left for the error. Drain the node, run "
            "`dcgmi diag -r 3`, and RMA the GPU (attach `nvidia-bug-report.sh`)."
        )
    if pending:
        return (
            "A row remap is pending and takes effect at the next GPU reset: drain the node when convenient and "
            "reset the GPU (`nvidia-smi -r -i <index>`) or reboot; until then error containment keeps other jobs "
            "safe."
        )
    return (
        "If a row remap is pending, drain the node and reset the GPU (`nvidia-smi -r -i <index>`) or reboot to "
        "apply it; if remapping failed, the bank has no spare rows left: run `dcgmi diag -r 3` and RMA the GPU. "
        "`nvidia-smi -q -d ROW_REMAPPER` tells which."
    )


@family.tip(
    id="xid_lookup",
    title="Look up the Xid and act on it",
    applies_to=(Condition.XID_RECENT.value,),
    docs=(_XID, _XID_CATALOG, _DEBUG_GUIDE),
    when="an Xid error in the recent window",
    reads=("xid",),
    score=always(90),
)
def _xid_text(f: Facts) -> str:
    xid = f.count("xid")
    if xid in XID_MEANINGS:
        meaning, action = XID_MEANINGS[xid]
        return f"Xid {xid} ({meaning}): {action}. NVIDIA's Xid catalog lists the resolution for each code."
    if xid is not None:
        return (
            f"Xid {xid}: look it up in NVIDIA's Xid catalog, which gives an immediate and an investigatory "
            "action for each code; `sudo dmesg -T | grep -i xid` shows the full message."
        )
    return (
        "An Xid error was logged: read it with `sudo dmesg -T | grep -i xid` and look the code up in NVIDIA's Xid "
        "catalog, which gives an immediate and an investigatory action for each code."
    )


@family.tip(
    id="update_driver_cuda",
    title="Run a current driver, CUDA and libraries",
    applies_to=(Reason.LOW_SM_ACTIVITY.value, Condition.XID_RECENT.value),
    docs=("https://docs.nvidia.com/deploy/cuda-compatibility/index.html", "https://pytorch.org/get-started/locally/"),
    when="Xid 61, 62, 119 or 120 (micro-controller and GSP faults); otherwise general advice",
    reads=("xid", "model"),
    score=lambda f: 60 if f.count("xid") in _DRIVER_XIDS else 10,
)
def _driver_text(f: Facts) -> str:
    xid = f.count("xid")
    observed = ""
    if xid in _DRIVER_XIDS:
        observed = f"Xid {xid} ({XID_MEANINGS[xid][0]}) is often fixed in newer drivers"
    advice = (
        "run a current data-center driver and a PyTorch build for a recent CUDA: newer cuDNN, cuBLAS and NCCL "
        f"releases carry kernels tuned for {this_gpu(f, 'recent GPUs')} and bug fixes; check the driver against "
        "the CUDA release's minimum in NVIDIA's compatibility table, and prefer the CUDA wheels or NGC containers "
        "over hand-mixed libraries"
    )
    return said(observed, advice)


@family.tip(
    id="hw_slowdown",
    title="Check the power supply and the brake signal",
    applies_to=(Condition.HW_SLOWDOWN.value,),
    docs=(NVSMI, _DCGM_DIAG),
    when="hardware slowdown or power-brake slowdown holds the clocks",
    reads=("temperature_celsius",),
    score=always(90),
)
def _hw_slowdown_text(f: Facts) -> str:
    temperature = f.number("temperature_celsius")
    observed = ""
    if temperature is not None:
        observed = f"hardware slowdown cuts the clocks with the GPU at {temperature:.0f} °C"
    advice = (
        "the board or the system asserts it for over-temperature, power-supply trouble or an external "
        "power-brake signal. Read `nvidia-smi -q -d PERFORMANCE` (HW Slowdown, HW Thermal Slowdown, HW Power "
        "Brake Slowdown), check the power supplies and the BMC event log; if all GPUs of the node show it, "
        "suspect the node's power; if one alone does, drain it and run `dcgmi diag -r 3`"
    )
    return said(observed, advice, "hardware slowdown cuts the clocks: ")


@family.tip(
    id="thermal_throttle",
    title="Fix the cooling of the throttled GPU",
    applies_to=(Condition.THERMAL_THROTTLE.value,),
    docs=(NVSMI, _DCGM_DIAG),
    when="software or hardware thermal slowdown holds the clocks",
    reads=("temperature_celsius", "model"),
    score=always(90),
)
def _thermal_text(f: Facts) -> str:
    temperature = f.number("temperature_celsius")
    observed = ""
    if temperature is not None:
        observed = f"{this_gpu(f)} is at {temperature:.0f} °C and thermal slowdown holds its clocks down"
    advice = (
        "check the airflow through the chassis (fans, blanking panels, filters, cables in the way) and the "
        "inlet temperature, compare with the neighbouring GPUs, and read "
        "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE` for the active slowdown and the slowdown temperature; "
        "slowdown with normal inlet air points to a fan, heat sink or thermal interface fault"
    )
    return said(observed, advice, "thermal slowdown holds the clocks down: ")


@family.tip(
    id="power_cap",
    title="Check the power limit",
    applies_to=(Condition.POWER_THROTTLE.value,),
    docs=(NVSMI, DCGM_FEATURES),
    when="the software power cap holds the clocks",
    reads=("power_ratio",),
    score=always(80),
)
def _power_text(f: Facts) -> str:
    power = f.ratio("power_ratio")
    check = "compare the enforced, default and maximum power limits in `nvidia-smi -q -d POWER`"
    if power is not None and power >= 0.95:
        observed = f"the GPU draws {percent(power)} of its power limit and the driver lowers clocks to stay under it"
        advice = (
            f"that is normal at full load; if throughput matters more than energy, {check}, raise a lowered "
            "limit with `nvidia-smi -pl <watts>` (root, up to the maximum), or ask whoever caps power in the "
            "data centre (DCGM power policy, rack or BMC capping)"
        )
    elif power is not None:
        observed = f"the power cap holds clocks down while the GPU draws {percent(power)} of its limit"
        advice = (
            f"short spikes or a limit set below the default do that; {check}, and raise a lowered limit with "
            "`nvidia-smi -pl <watts>` or ask whoever caps power in the data centre"
        )
    else:
        observed = ""
        advice = (
            f"{check}; raise a lowered limit with `nvidia-smi -pl <watts>` (root, up to the maximum) or ask "
            "whoever caps power in the data centre (DCGM power policy, rack or BMC capping)"
        )
    return said(observed, advice, "the power cap holds the clocks down: ")


@family.tip(
    id="pcie_link",
    title="Restore the PCIe link to full speed",
    applies_to=(Condition.PCIE_DEGRADED.value,),
    docs=(NVSMI, _DCGM_DIAG),
    when="the link runs below its maximum generation or width under load",
    reads=("pcie_generation", "pcie_max_generation", "pcie_width", "pcie_max_width"),
    score=always(85),
)
def _pcie_text(f: Facts) -> str:
    g, g_max = f.count("pcie_generation"), f.count("pcie_max_generation")
    w, w_max = f.count("pcie_width"), f.count("pcie_max_width")
    observed = ""
    if g and g_max and w and w_max:
        observed = f"the PCIe link runs Gen{g} x{w} but can run Gen{g_max} x{w_max}"
        now, best = pcie_bandwidth(g, w), pcie_bandwidth(g_max, w_max)
        if now is not None and best:
            observed += (
                f": about {now:.0f} GB/s per direction instead of {best:.0f} ({percent(now / best)}), which "
                "slows every host-device copy"
            )
    elif w and w_max:
        observed = f"the PCIe link runs x{w} of x{w_max} lanes"
    elif g and g_max:
        observed = f"the PCIe link runs Gen{g} of Gen{g_max}"
    advice = (
        "reseat the card, check risers and cables, check the slot's PCIe settings in the BIOS (a forced lower "
        "speed, bifurcation), and compare LnkSta with LnkCap in `sudo lspci -vv`; a link that trains down again "
        "after reseating points to the riser, the slot or the GPU. GPUs drop to a lower generation when idle to "
        "save power, so check under load"
    )
    return said(observed, advice, "the PCIe link runs below what the GPU and slot support: ")
