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

# Idle this long (longer than any pause for evaluation or a checkpoint): reclaim by policy, not by hand.
IDLE_POLICY_SECONDS = 3600.0
