"""The words every part of gpulens shares: usage states, the reasons behind them, health conditions.

The agent decides them, the alert rules, the dashboard and the reports read them; a name here is a
label value in Prometheus, so it never changes once released.
"""

from __future__ import annotations

from enum import Enum

# The kinds of job that hold GPUs, as the agent's attribution names them (the `job_kind` label's values).
JOB_KINDS = ("slurm", "kubernetes", "docker", "process")


class State(str, Enum):
    """Exactly one per GPU per sampling cycle."""

    FREE = "free"  # no process holds the GPU and nothing has it allocated
    IDLE = "idle"  # held, but no kernel has run for the patience window
    DATA_STARVED = "data_starved"  # kernels in bursts, and the job's input side is the bottleneck
    UNDERUTILIZED = "underutilized"  # kernels run, but use little of the GPU
    BUSY = "busy"  # healthy use
    UNKNOWN = "unknown"  # no data to decide: GPU lost or unreadable, NVML down, MIG, no samples, processes unreadable

    def __str__(self) -> str:
        return self.value


# Each state's name wherever a person reads it: the dashboard's pages, the reports, the messages. One name,
# so that a report read beside the dashboard says the same thing.
STATE_NAME = {
    State.FREE.value: "Free",
    State.IDLE.value: "Idle (held, no work)",
    State.DATA_STARVED.value: "Starved for data",
    State.UNDERUTILIZED.value: "Underused",
    State.BUSY.value: "Busy",
    State.UNKNOWN.value: "Unknown",
}


WASTED_STATES = (State.IDLE, State.DATA_STARVED, State.UNDERUTILIZED)


# Where a traced step's time goes (gpulens trace; gpulens/torch/summary.py), and how a sentence names each
# part when it is the bottleneck: "the trace shows 71% of each step waiting for the next batch".
TRACE_PARTS = ("data_wait", "host", "compute", "communication")
# The states a trace request ends in (agent/jobs/traces.py): it brought a trace, or why not.
TRACE_FINISHED = ("done", "failed", "refused", "lost")
TRACE_PART_WORDS = {
    "data_wait": "waiting for the next batch",
    "host": "in host-side work while the device idles",
    "communication": "in communication the compute does not hide",
    "compute": "in device compute",
}


class Reason(str, Enum):
    """Why a GPU is in its state; each belongs to one state."""

    NO_PROCESS = "no_process"
    NO_KERNELS = "no_kernels"
    ALLOCATED_NO_PROCESS = "allocated_no_process"
    INPUT_WAIT_REPORTED = "input_wait_reported"
    INPUT_CPU_SATURATED = "input_cpu_saturated"
    WORKERS_SATURATED = "workers_saturated"
    LOW_SM_ACTIVITY = "low_sm_activity"
    LOW_OCCUPANCY = "low_occupancy"
    LOW_BUSY_RATIO = "low_busy_ratio"
    SPINNING_KERNEL = "spinning_kernel"
    HEALTHY = "healthy"
    NO_DATA = "no_data"
    PROCESSES_UNKNOWN = "processes_unknown"
    GPU_LOST = "gpu_lost"
    GPU_UNREADABLE = "gpu_unreadable"
    NVML_DOWN = "nvml_down"
    MIG_ENABLED = "mig_enabled"
    MIG_NO_ACTIVITY = "mig_no_activity"

    def __str__(self) -> str:
        return self.value


REASON_STATE: dict[Reason, State] = {
    Reason.NO_PROCESS: State.FREE,
    Reason.NO_KERNELS: State.IDLE,
    Reason.ALLOCATED_NO_PROCESS: State.IDLE,
    Reason.INPUT_WAIT_REPORTED: State.DATA_STARVED,
    Reason.INPUT_CPU_SATURATED: State.DATA_STARVED,
    Reason.WORKERS_SATURATED: State.DATA_STARVED,
    Reason.LOW_SM_ACTIVITY: State.UNDERUTILIZED,
    Reason.LOW_OCCUPANCY: State.UNDERUTILIZED,
    Reason.LOW_BUSY_RATIO: State.UNDERUTILIZED,
    Reason.SPINNING_KERNEL: State.UNDERUTILIZED,
    Reason.HEALTHY: State.BUSY,
    Reason.NO_DATA: State.UNKNOWN,
    Reason.PROCESSES_UNKNOWN: State.UNKNOWN,
    Reason.GPU_LOST: State.UNKNOWN,
    Reason.GPU_UNREADABLE: State.UNKNOWN,
    Reason.NVML_DOWN: State.UNKNOWN,
    Reason.MIG_ENABLED: State.UNKNOWN,
    Reason.MIG_NO_ACTIVITY: State.UNKNOWN,
}


class JobFinding(str, Enum):
    """What is seen across a job's GPUs together (gpulens.tips.jobs); a GPU's own verdict cannot say it."""

    GPUS_UNUSED = "gpus_unused"  # the job runs kernels on some of its GPUs and none on the others
    GPU_LAGS = "gpu_lags"  # one of the job's GPUs is markedly less busy than the others

    def __str__(self) -> str:
        return self.value


class Condition(str, Enum):
    """Health conditions; any number may hold at once, whatever the state."""

    THERMAL_THROTTLE = "thermal_throttle"  # sw or hw thermal slowdown
    POWER_THROTTLE = "power_throttle"  # software power cap holding clocks down
    HW_SLOWDOWN = "hw_slowdown"  # hardware slowdown or power brake (external signal)
    PCIE_DEGRADED = "pcie_degraded"  # link below its maximum generation or width while in use
    ECC_UNCORRECTED = "ecc_uncorrected"  # uncorrectable ECC errors since the driver loaded
    ROW_REMAP_FAILURE = "row_remap_failure"  # remapping failed or is pending a reset
    XID_RECENT = "xid_recent"  # an Xid error in the recent window
    LOST = "lost"  # the GPU fell off the bus

    def __str__(self) -> str:
        return self.value


# A GPU's state in its history while it was off the bus (condition `lost`), where its verdict reads unknown.
LOST_STATE = "lost"

# Each state's colour wherever a chart draws it: the dashboard's, the HTML report's and the Grafana
# dashboard's (deploy/grafana/gpulens.json holds these values; its test compares them), so that one reads
# beside the other. Wasted states warm, busy green, free blue, unknown grey; a GPU off the bus black, apart
# from the other unknowns (a failure, not a lack of data).
STATE_COLOUR = {
    State.IDLE.value: "#d62728",
    State.DATA_STARVED.value: "#ff7f0e",
    State.UNDERUTILIZED.value: "#e6b800",
    State.BUSY.value: "#2ca02c",
    State.FREE.value: "#7fb3d5",
    State.UNKNOWN.value: "#9e9e9e",
    LOST_STATE: "#212121",
}
