"""Every threshold the verdicts and the tips use, in one place, each with where its number comes from.

The agent's diagnosis, the alert rules (docs/alerts.md lists the PromQL twins) and the reports read
the verdict's; change a number here and in the rules together. The tips' own are at the end.
"""

# A cycle whose busy ratio is at most this counts as "no kernel ran". NVML rounds utilization samples
# to whole percent, and a display or a monitoring context can show up as 1%.
IDLE_BUSY_MAX = 0.01

# How long a held GPU must run no kernel before it is called idle. Long enough to ride out a pause
# between epochs, evaluation or checkpointing (minutes on large models); alert rules add their own
# `for:` on top. Configurable per agent (--diagnosis.idle-patience).
IDLE_PATIENCE_SECONDS = 300.0

# A quiet stretch shorter than this is a gap between bursts of one workload (a data-starved job waits
# seconds between steps) and is judged by the rolling window; a longer one is a pause that the verdict
# rides out until the patience window above runs out.
PAUSE_MIN_SECONDS = 10.0

# The rolling window over which busy ratio, SM activity and input-side evidence are averaged.
WINDOW_SECONDS = 60.0

# A new verdict must hold this long before it replaces the current one (hysteresis), so a GPU at the
# border between two states does not flap. Moves to or from `free` and `unknown` are facts, not
# judgements, and happen at once.
DWELL_SECONDS = 15.0

# A restarted agent (a rollout, a crash) takes up a device's verdict where the last run left it, its `since`
# included, when the device's first verdict is in the same state, held by the same processes and jobs, and
# the last run's last cycle was at most this long before: a minute or two of a rollout, not a reboot. Else an
# idle GPU's "idle for 40 minutes" would start again at every rollout, and its alerts resolve with it.
RESUME_GAP_SECONDS = 300.0

# Under an unchanged verdict (state, reason and conditions), a new first tip replaces the current one only
# once it was the pick this long, an empty pick included: the evidence's own window, so that a pause or a
# burst shorter than the window does not rewrite the advice, nor make a new label set of
# gpulens_gpu_verdict_info each time. A new verdict brings its tips at once: it waited its own dwell.
TIP_DWELL_SECONDS = WINDOW_SECONDS

# Busy ratio (share of time a kernel runs) at or above which the GPU is kept fed. Below it, a job
# with input-side evidence is data-starved. 0.8 mirrors DCGM's guidance that SM activity of 0.8 or
# more is needed for good use.
BUSY_HEALTHY = 0.8

# Below this busy ratio the GPU waits for work half the time: underutilized even without other
# evidence. DCGM calls SM activity below 0.5 likely ineffective; we hold kernel time to the same bar.
BUSY_LOW = 0.5

# GPM SM activity below this: kernels run but leave most SMs empty (DCGM: < 0.5 likely ineffective).
SM_ACTIVITY_LOW = 0.5

# Kernels that keep few warps resident and use no tensor cores while SM activity is middling: small
# batches or launch-bound code. GEMMs on tensor cores run at low occupancy by design, hence the
# tensor-activity guard.
SM_OCCUPANCY_LOW = 0.1
TENSOR_ACTIVITY_NONE = 0.05
SM_ACTIVITY_GOOD = 0.8

# "Kernel always running but the GPU does nothing": a hung collective (NCCL) spins one kernel. With GPM,
# SM activity near zero; without it, power near idle while utilization reads full.
SPIN_BUSY_MIN = 0.9
SPIN_SM_ACTIVITY_MAX = 0.05
SPIN_POWER_RATIO_MAX = 0.3

# In-job evidence: share of each step spent waiting for the next batch. The PyTorch profiler flags
# DataLoader time above 5% of a step as worth a look; we call a job starved only at four times that.
DATA_WAIT_STARVED = 0.2

# Host evidence: a process at or above this share of one core is saturated. SageMaker's CPU-bottleneck
# rule uses CPU above 90%.
CPU_SATURATED = 0.9

# An Xid counts as recent for this long.
XID_RECENT_SECONDS = 600.0

# Report rules (jobstats): GPU utilization below these is red / a warning; shorter jobs are not judged.
REPORT_BUSY_RED = 0.15
REPORT_BUSY_WARN = 0.25
REPORT_MIN_JOB_SECONDS = 300.0

# Right-sizing the whole allocation (`gpulens report digest`, `report job`): a request is an over-ask when the job
# used at most this share of it. The marks of Princeton's job_defense_shield (its docs/alert/*.md): CPU efficiency
# at most 60% (low_cpu_util.md, eff_thres_pct), memory used at most 35% of the allocation (excess_cpu_memory.md,
# ratio_threshold), run time at most 20% of the limit (time_limits_gpu.md, overall_ratio_threshold). Cores compare
# the mean in use with the cores asked for, memory the peak on one node with the memory asked for on one node.
REQUEST_CORES_USED_MAX = 0.6
REQUEST_MEMORY_USED_MAX = 0.35
REQUEST_TIME_USED_MAX = 0.2
# The request suggested instead holds what was used with this headroom, then is rounded up (cores to a whole
# core, memory to a whole GiB, time to a whole hour): 80% used, job_defense_shield's target for memory and time
# ("A good target value for Percent-Used is 80%", its email/excess_cpu_memory.txt and excessive_time.txt, whose
# example asks 10 h for a job of 8). It covers a memory peak between two samples, and runs of one job that take
# longer than this one; cores take the same (our choice: a mean hides DataLoader bursts).
REQUEST_HEADROOM = 1.25

# Trend rules (`gpulens report trend`), our own choices: a run is flagged with a waste reason (idle,
# data_starved, underutilized) that took at least a quarter of its GPU-hours, jobstats' warning mark carried
# over to a share of time; the reason has gone from a later run when it takes less than a twentieth, about
# what start-up and checkpoints cost a healthy run. The fleet's waste a day counts as unchanged within a
# tenth either way: day-to-day swings of a fleet's mix of jobs are that large.
TREND_REASON_FLAGGED = 0.25
TREND_REASON_GONE = 0.05
TREND_UNCHANGED_RATIO = 0.10

# Probes: a judged result (device copy, pinned host copies, matmuls) below this share of its datasheet
# peak makes `gpulens probe` exit non-zero. Careful measurements of healthy GPUs reach 0.8-0.9 of those
# peaks (one H200: device copy 4.3 of 4.8 TB/s, bf16 8192^3 matmul 790 of 989 TFLOP/s; a Gen5 x16 link
# about 0.85 of 63 GB/s pinned), and power-capped boards (T4, L4) less; half the datasheet is a broken
# or badly configured GPU by any of those measures (a link trained at x8, HBM or clocks degraded).
# Comparison with the same model's fleet median (rules/probes.rules.yml) catches smaller losses.
PROBE_MIN_PEAK_RATIO = 0.5

# Probes against peers: a result below this share of the median of the same model and test across the
# fleet marks the GPU as an outlier on the dashboard. Identical healthy GPUs measured the same way land
# within a few percent of each other; a 10% shortfall is beyond run-to-run noise and worth a look.
PROBE_FLEET_RATIO_LOW = 0.9

# -- Alert rules (rules/alerts.rules.yml; docs/alerts.md explains each; tests/rules holds the two equal) ----

# A held GPU idle (after the idle patience above) or starved for data this long costs a team real
# GPU-hours: long enough to skip a coffee break or a slow evaluation, short enough to act on the same day.
ALERT_IDLE_SECONDS = 1800.0
ALERT_DATA_STARVED_SECONDS = 1800.0
# Underuse is often by design (inference, small models); only a long stretch is worth a note.
ALERT_UNDERUTILIZED_SECONDS = 7200.0

# Device memory in use above this share, for 15 minutes: out-of-memory errors are near. The caching
# allocators of PyTorch and JAX keep freed memory, so a lower number would flag healthy jobs.
ALERT_MEMORY_FULL_RATIO = 0.95

# Share of the last 15 minutes a GPU was thermally throttled: brief throttling at full load is normal,
# a quarter of the time is a cooling problem.
ALERT_THERMAL_THROTTLE_SHARE = 0.25
# Share of the last hour at the software power cap: reaching the cap under heavy kernels is expected, so
# only most of an hour is worth a note (usually a limit set below the board's default).
ALERT_POWER_THROTTLE_SHARE = 0.5

# Share of the last 5 minutes a GPU was slowed by an external signal (the power supply, the power brake):
# a signal seen in one or two scrapes is a blip, a quarter of the time is a fault of the node.
ALERT_HW_SLOWDOWN_SHARE = 0.25
# Share of the last 30 minutes a GPU's PCIe link ran below its maximum. The agent judges the link only under
# load, so a GPU that works a little sees the condition a little; a tenth keeps a link caught retraining as
# load starts (a sample or two) from counting as trained down.
ALERT_PCIE_DEGRADED_SHARE = 0.1

# The agent's last sampling cycle older than this: the sampler is stuck on a driver call (the /healthz
# endpoint answers 503 past the same kind of bound).
ALERT_SAMPLING_STALE_SECONDS = 120.0

# The probe alerts use PROBE_MIN_PEAK_RATIO and PROBE_FLEET_RATIO_LOW above, so that an alert, the
# dashboard and `gpulens probe`'s exit status agree on what is slow.


# ---------------------------------------------------------------- the tips
# Every number the tips (gpulens/tips) judge evidence by, beside the verdict's above.

# The PyTorch profiler flags DataLoader time above 5% of a step as worth a look; below it the batches are
# ready when the step asks for them, so the input-side tips are ruled out.
DATA_WAIT_NOTABLE = 0.05

# The highest score an input-side tip keeps when the job waits for batches, but less than the verdict's
# starvation threshold: still shown, after the advice that answers the verdict.
INPUT_MILD_MAX = 15
# A tip cites the job's trace when the part it is about took at least this share of each traced step:
# below it, the trace does not back the tip, and quoting it would argue against the advice.
TRACE_CITED = 0.2

# Under half a core, a process is mostly waiting (on storage, the network or the GPU), not computing.
CPU_MOSTLY_WAITING = 0.5

# At or above this share of device memory a bigger batch is unlikely to fit: the sampled value is an
# average, not the peak, and the caching allocator needs slack. Our judgement, not a published number.
MEMORY_SHORT = 0.85

# A bigger batch should aim at this share of device memory, for the same two reasons.
MEMORY_TARGET = 0.8

# Grow a batch by at most this factor per suggestion, in doublings: the memory sample is not the peak.
BATCH_GROWTH_MAX = 4

# DataLoader workers to start with, at most. Each worker holds its own copy of the Dataset object and
# prefetch_factor batches in host memory, and the first few workers give most of the gain; raise past
# it only while data_wait_ratio stays high.
WORKERS_START_MAX = 8

# Deeper than this prefetch_factor only costs host memory: the workers themselves are too slow.
PREFETCH_MAX = 8

# Light use: a job below both could run on a MIG slice or a smaller GPU. Our judgement.
LIGHT_MEMORY = 0.25
LIGHT_ACTIVITY = 0.25

# A smaller GPU must hold the memory in use plus this headroom for peaks between samples.
RIGHT_SIZE_HEADROOM = 1.25

# DRAM bandwidth at or above this share of peak while SMs are underused: memory-bound kernels.
DRAM_BOUND = 0.6

# Tensor Cores already busy: the tensor pipes (NVML GPM "ANY_TENSOR_UTIL", the share of time the SMs run any
# tensor instruction; docs.nvidia.com/deploy/nvml-api/api/group__nvmlGpmEnums.html) active at least this
# share of the time. Only fp16, bf16, TF32, int8, fp8 and fp64-tensor math issues tensor instructions;
# float32 matmuls without TF32 run on the CUDA cores and read near zero (the verdict's
# TENSOR_ACTIVITY_NONE, 0.05, is that floor). At four times the floor the matmuls demonstrably run on
# Tensor Cores in reduced precision already, and advice to turn on autocast or TF32 would be wrong. Not
# higher: even well-tuned mixed-precision training spends much of each step in elementwise, normalization
# and communication kernels that use no Tensor Cores, so its tensor activity sits well below 1. Our
# judgement, not a published number.
TENSOR_ACTIVITY_BUSY = 0.2

# Power draw at or above this share of the enforced limit: the GPU works as hard as its power budget lets
# it (clocks drop at the cap, nvidia-smi's "SW Power Cap"); small or sparse kernels cannot draw that much.
# Stands in for SM activity on GPUs without GPM (before Hopper). Our judgement.
POWER_NEAR_LIMIT = 0.9

# A busy GPU is doing its work: tips for the `healthy` reason are shown only when the evidence points to
# them (score 60 or more, see gpulens.tips); general and merely plausible advice waits for a GPU that needs
# it, so that a busy GPU's top tip is never advice nothing called for.
BUSY_ADVICE_MIN = 60

# Idle this long (longer than any pause for evaluation or a checkpoint): reclaim by policy, not by hand.
IDLE_POLICY_SECONDS = 3600.0

# A job's GPU lags the others when its busy ratio is this much below the median of the job's other GPUs, and
# they are kept at least half busy (the verdict's BUSY_LOW). In data- or tensor-parallel training every rank
# waits for the slowest at each collective, so a gap this wide costs every GPU of the job that share of its
# time; narrower gaps are the noise of uneven batches. Our judgement.
LAG_BUSY_GAP = 0.25
