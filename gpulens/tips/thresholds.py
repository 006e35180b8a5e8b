"""Every number the tips judge evidence by, each with where it comes from (the verdict's: gpulens.thresholds)."""

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
