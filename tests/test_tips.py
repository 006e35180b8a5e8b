"""The remediation catalog: coverage of the vocabulary, rendering with and without evidence, ranking."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens import tips
from gpulens.tips import CATALOG, EVIDENCE_KEYS, NO_ADVICE, catalog, render, tips_for
from gpulens.vocabulary import Condition, JobFinding, Reason

GIB = 2**30

# Tip ids are Prometheus label values: renaming or dropping one breaks dashboards and alert routes.
# Adding one means adding it here, on purpose.
STABLE_IDS = {
    "gpu_lags",
    "request_fewer_gpus",
    "allocator_fragmentation",
    "channels_last",
    "cuda_graphs",
    "cudnn_benchmark",
    "dataloader_prefetch",
    "dataloader_workers",
    "dataset_storage",
    "ddp_not_dataparallel",
    "debug_hang",
    "dynamic_batching",
    "ecc_uncorrected",
    "gpu_fell_off_bus",
    "gpu_unreadable",
    "gpu_preprocessing",
    "gradient_accumulation",
    "gradient_checkpointing",
    "host_device_sync",
    "hw_slowdown",
    "idle_timeout_policy",
    "larger_batch",
    "mig_monitoring",
    "mig_slices",
    "mixed_precision",
    "model_parallelism",
    "more_cpu_cores",
    "numa_binding",
    "nvlink_topology",
    "nvml_unavailable",
    "pcie_link",
    "pin_memory",
    "power_cap",
    "processes_unreadable",
    "profile_the_job",
    "release_idle_gpu",
    "right_size_gpu",
    "row_remap",
    "tensorrt_inference",
    "tf32_matmul",
    "thermal_throttle",
    "torch_compile",
    "unused_gpu_request",
    "update_driver_cuda",
    "xid_lookup",
}

# Documentation hosts the tips may cite: vendors' and projects' own documentation.
DOC_HOSTS = {
    "pytorch.org",
    "docs.nvidia.com",
    "slurm.schedmd.com",
    "kubernetes.io",
    "keda.sh",
    "github.com",
}

# Evidence from an input-starved job, the brief's example.
STARVED = {
    "num_workers": 0,
    "main_process_cpu_ratio": 1.0,
    "busy_ratio": 0.18,
    "cpu_cores_allowed": 16,
    "pin_memory": False,
}

# Two evidence sets that between them give every tip something to quote: one job short of memory,
# one light job.
HEAVY = {
    "busy_ratio": 0.35,
    "sm_activity": 0.3,
    "sm_occupancy": 0.05,
    "tensor_activity": 0.0,
    "dram_bandwidth": 0.7,
    "power_ratio": 0.6,
    "memory_used_ratio": 0.93,
    "memory_total_bytes": 80 * GIB,
    "data_wait_ratio": 0.4,
    "steps_per_second": 2.5,
    "num_workers": 4,
    "pin_memory": False,
    "prefetch_factor": 2,
    "persistent_workers": False,
    "batch_size": 64,
    "autocast": False,
    "tf32": False,
    "main_process_cpu_ratio": 1.0,
    "workers_cpu_ratio_max": 0.97,
    "cpu_cores_allowed": 8,
    "cpu_cores_used": 7.8,
    "idle_seconds": 9000,
    "held_seconds": 21600,
    "torch_reserved_bytes": 70 * GIB,
    "torch_allocated_bytes": 52 * GIB,
    "alloc_retries": 14,
    "ooms": 2,
    "pcie_generation": 3,
    "pcie_max_generation": 4,
    "pcie_width": 8,
    "pcie_max_width": 16,
    "temperature_celsius": 91,
    "xid": 119,
    "model": "NVIDIA H100 80GB HBM3",
    "processes": 2,
    "job_kind": "slurm",
    "ecc_uncorrected": 3,
    "row_remap_pending": True,
    "job_gpus": 8,
    "job_gpus_used": 1,
    "job_gpus_unused": 7,
    "job_used_gpu": "node-a GPU 0",
    "job_lagging_gpu": "node-a GPU 3",
    "job_lagging_busy_ratio": 0.4,
    "job_others_busy_ratio": 0.95,
}
LIGHT = {
    "busy_ratio": 0.9,
    "sm_activity": 0.1,
    "sm_occupancy": 0.05,
    "memory_used_ratio": 0.1,
    "memory_total_bytes": 80 * GIB,
    "autocast": True,
    "autocast_dtype": "float16",
    "model": "NVIDIA A100-SXM4-80GB",
}
# A job whose Python loop sets the pace: the GPU waits, and not for batches.
LAUNCH_BOUND = {"busy_ratio": 0.3, "main_process_cpu_ratio": 1.0, "data_wait_ratio": 0.01}

# What a missing or broken value would leave in a sentence.
FORBIDDEN = re.compile(r"None|[{}]|\b(?i:nan|inf)\b")


def ids(rendered: list[tips.RenderedTip]) -> list[str]:
    return [r.id for r in rendered]


# -- the catalog ----------------------------------------------------------------------------------------------


def test_module_imports_no_heavy_dependency():
    code = "import sys, gpulens.tips; print(sorted({'torch', 'streamlit', 'pynvml'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ids_are_stable_unique_snake_case():
    assert set(CATALOG) == STABLE_IDS
    for tip_id, tip in CATALOG.items():
        assert tip.id == tip_id
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", tip_id), tip_id
        assert tip.title and tip.title[0].isupper() and not tip.title.endswith(".")
    assert len({tip.title for tip in CATALOG.values()}) == len(CATALOG)


def test_the_catalog_order_lists_every_familys_tips_once():
    defined = [tip.id for module in catalog.FAMILIES for tip in module.family.tips]
    assert sorted(catalog.ORDER) == sorted(defined) and len(set(defined)) == len(defined)
    assert list(CATALOG) == list(catalog.ORDER)


def test_no_advice_is_exactly_the_free_and_unknown_reasons():
    assert NO_ADVICE == {Reason.NO_PROCESS.value, Reason.NO_DATA.value}


@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_every_reason_has_a_tip_unless_no_advice_applies(reason):
    answering = [tip.id for tip in CATALOG.values() if reason.value in tip.applies_to]
    if reason.value in NO_ADVICE:
        assert answering == []
        assert tips_for(reason, (), {}) == []
    elif reason is Reason.HEALTHY:
        # A busy GPU gets only the advice its evidence points to: none without evidence.
        assert answering
        assert tips_for(reason, (), {}, limit=50) == []
        assert ids(tips_for(reason, (), {"autocast": False}))[0] == "mixed_precision"
    else:
        assert answering
        assert tips_for(reason, (), {}), f"{reason} has tips but none survives empty evidence"


@pytest.mark.parametrize("condition", list(Condition), ids=str)
def test_every_condition_has_a_tip(condition):
    rendered = tips_for(None, [condition], {})
    assert rendered
    assert condition.value in CATALOG[rendered[0].id].applies_to


def test_applies_to_and_reads_use_the_vocabulary():
    known = {r.value for r in Reason} | {c.value for c in Condition} | {f.value for f in JobFinding}
    for tip in CATALOG.values():
        assert tip.applies_to and set(tip.applies_to) <= known, tip.id
        assert set(tip.reads) <= set(EVIDENCE_KEYS), tip.id
        assert tip.when and "|" not in tip.when


class _Recording(tips.Facts):
    """Facts that note every evidence key asked for."""

    def __init__(self, evidence, asked: set[str]) -> None:
        super().__init__(evidence)
        self.asked = asked

    def _raw(self, key: str) -> object:
        self.asked.add(key)
        return super()._raw(key)


@pytest.mark.parametrize("tip_id", sorted(STABLE_IDS))
def test_reads_names_exactly_the_evidence_a_tip_uses(tip_id):
    # `reads` is what docs/tips.md and a reviewer trust: a key the score or the text reads but `reads`
    # leaves out is evidence nobody knows the tip weighs; a key it names but never reads is a claim.
    tip, asked = CATALOG[tip_id], set()
    for evidence in (*CONTEXTS.values(), *_sweep(60)):
        tip.score(_Recording(evidence, asked))
        tip.advise(_Recording(evidence, asked))
    assert asked == set(tip.reads), f"{tip_id}: reads but undeclared {asked - set(tip.reads)}, " + (
        f"declared but unread {set(tip.reads) - asked}"
    )


def test_docs_are_well_formed_https_documentation_urls():
    for tip in CATALOG.values():
        assert tip.docs, tip.id
        for url in tip.docs:
            parsed = urlparse(url)
            assert parsed.scheme == "https", url
            assert parsed.hostname in DOC_HOSTS, url
            assert parsed.path.startswith("/") and not re.search(r"\s", url), url
            assert "//" not in parsed.path, url


def test_docs_table_matches_the_catalog():
    text = (Path(__file__).resolve().parents[1] / "docs" / "tips.md").read_text()
    assert tips.markdown_table() in text, "docs/tips.md is out of date: paste tips.markdown_table() into it"
    for tip_id in CATALOG:
        assert f"`{tip_id}`" in text
    catalog = text[text.index("## The catalog") :]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", catalog, re.MULTILINE))
    assert documented == set(CATALOG)


# -- rendering --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tip_id", sorted(STABLE_IDS))
def test_every_tip_renders_without_evidence(tip_id):
    for evidence in ({}, None, dict.fromkeys(EVIDENCE_KEYS)):
        rendered = render(tip_id, evidence)
        assert rendered.id == tip_id and rendered.title == CATALOG[tip_id].title
        assert rendered.docs == CATALOG[tip_id].docs
        assert rendered.text[0].isupper() and rendered.text.endswith("."), rendered.text
        assert not FORBIDDEN.search(rendered.text), rendered.text


@pytest.mark.parametrize("tip_id", sorted(STABLE_IDS))
def test_tips_that_read_evidence_quote_it(tip_id):
    tip = CATALOG[tip_id]
    generic = render(tip_id, {}).text
    with_evidence = {render(tip_id, evidence).text for evidence in (HEAVY, LIGHT, LAUNCH_BOUND)}
    if tip.reads:
        assert with_evidence - {generic}, f"{tip_id} reads {tip.reads} but renders the same text"
    for text in with_evidence:
        assert not FORBIDDEN.search(text), text


def test_the_briefs_example():
    text = render("dataloader_workers", STARVED).text
    assert text.startswith(
        "`num_workers` is 0 and the main process uses 100% of a core while the GPU is busy 18% of the time: "
        "set `num_workers=8`"
    ), text
    for part in ("num_workers", "0", "100%", "18%", "16 cores", "`pin_memory=True`"):
        assert part in text


def test_a_loop_whose_batches_come_from_no_dataloader_is_told_to_make_one_not_to_change_its_settings():
    # A plain generator: the in-job library reads no DataLoader settings, and the host shows no workers.
    plain = {"dataloader": False, "num_workers": 0, "main_process_cpu_ratio": 1.0, "busy_ratio": 0.18}
    workers = render("dataloader_workers", {**plain, "cpu_cores_allowed": 16}).text
    assert workers.startswith("The loop's batches come from an iterable that is not a DataLoader and the main"), workers
    assert "make the batches in a `torch.utils.data.DataLoader` over the dataset, with `num_workers=8`" in workers
    assert "`num_workers` is 0" not in workers and "in the DataLoader" not in workers
    assert "cores the job may use minus one" in render("dataloader_workers", plain).text
    pin = render("pin_memory", plain).text
    assert "call `.pin_memory()` on each batch's tensors" in pin and "set `pin_memory=True`" not in pin
    assert "are settings of a DataLoader with workers" in render("dataloader_prefetch", plain).text
    order = ids(tips_for(Reason.INPUT_CPU_SATURATED, (), plain))
    assert order[0] == "dataloader_workers" and "dataloader_prefetch" not in order, order
    # A loader whose settings are reported keeps the settings' advice.
    reported = render("dataloader_workers", {**STARVED, "dataloader": True}).text
    assert reported == render("dataloader_workers", STARVED).text


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (4, 3), (6.5, 5), (9, 8), (16, 8), (128, 8)])
def test_worker_suggestion_follows_the_cores_allowed(cores, workers):
    text = render("dataloader_workers", {**STARVED, "cpu_cores_allowed": cores}).text
    assert f"`num_workers={workers}`" in text, text


def test_worker_suggestion_doubles_past_the_start_within_the_cores():
    assert tips.worker_plan(tips.Facts({"num_workers": 8, "cpu_cores_allowed": 32})) == (16, True)
    assert tips.worker_plan(tips.Facts({"num_workers": 8, "cpu_cores_allowed": 12})) == (11, True)
    assert tips.worker_plan(tips.Facts({"num_workers": 15, "cpu_cores_allowed": 16})) == (None, False)
    assert tips.worker_plan(tips.Facts({"num_workers": 3})) == (None, True)
    full = render("dataloader_workers", {"num_workers": 15, "cpu_cores_allowed": 16}).text
    assert "will not help" in full and "num_workers=" not in full


def test_counts_reported_as_floats_are_counts():
    # The agent's verdict carries num_workers as a float (0.0); it must read as 0, and 2.5 as nothing.
    as_float = render("dataloader_workers", {**STARVED, "num_workers": 0.0}).text
    assert as_float == render("dataloader_workers", STARVED).text
    assert "`num_workers` is" not in render("dataloader_workers", {"num_workers": 2.5}).text


@pytest.mark.parametrize(
    ("used", "suggested"),
    [(0.1, "batch_size=128"), (0.2, "batch_size=128"), (0.35, "batch_size=64"), (0.4, "batch_size=64")],
)
def test_batch_suggestion_follows_memory_headroom(used, suggested):
    text = render("larger_batch", {"batch_size": 32, "memory_used_ratio": used, "memory_total_bytes": 80 * GIB}).text
    assert f"`{suggested}`" in text and f"{round(used * 100)}% of its 80 GiB" in text, text


def test_no_bigger_batch_when_memory_is_short():
    for short in ({"memory_used_ratio": 0.9}, {"memory_used_ratio": 0.3, "ooms": 1}, {"alloc_retries": 3}):
        offered = ids(tips_for(Reason.LOW_OCCUPANCY, (), {**short, "batch_size": 32}, limit=50))
        assert "larger_batch" not in offered
    offered = ids(tips_for(Reason.LOW_OCCUPANCY, (), {"memory_used_ratio": 0.93, "batch_size": 32}, limit=4))
    assert {"gradient_accumulation", "gradient_checkpointing"} <= set(offered)
    assert (
        "`batch_size=16` with k=2 keeps an effective batch of 32"
        in render("gradient_accumulation", {"memory_used_ratio": 0.93, "batch_size": 32}).text
    )


def test_numbers_are_formatted_for_people():
    text = render(
        "allocator_fragmentation",
        {"torch_reserved_bytes": 70 * GIB, "torch_allocated_bytes": 52.4 * GIB, "alloc_retries": 1},
    ).text
    assert "70 GiB" in text and "52.4 GiB" in text and "17.6 GiB" in text and "1 allocation," in text
    assert (
        "3.5 GiB"
        in render(
            "right_size_gpu", {"memory_used_ratio": 0.035, "memory_total_bytes": 80 * GIB, "sm_activity": 0.1}
        ).text
    )  # 2.8 GiB in use plus 25%
    idle = render("release_idle_gpu", {"idle_seconds": 9000, "held_seconds": 21600}).text
    assert "2 h 30 min of the 6 h" in idle
    assert "18%" in render("host_device_sync", {"busy_ratio": 0.183}).text
    assert "45 s" in render("release_idle_gpu", {"idle_seconds": 45}).text


def test_pcie_tip_computes_the_bandwidth_lost():
    text = render(
        "pcie_link", {"pcie_generation": 3, "pcie_max_generation": 4, "pcie_width": 8, "pcie_max_width": 16}
    ).text
    assert "Gen3 x8" in text and "Gen4 x16" in text and "about 8 GB/s" in text and "instead of 32 (25%)" in text


def test_precision_advice_follows_the_gpu():
    assert "bfloat16" in render("mixed_precision", {"autocast": False, "model": "NVIDIA H100 80GB HBM3"}).text
    old = render("mixed_precision", {"autocast": False, "model": "Tesla V100-SXM2-32GB"}).text
    assert "float16" in old and "GradScaler" in old and "bfloat16" not in old
    assert "TF32 needs an Ampere" in render("tf32_matmul", {"model": "Tesla T4"}).text


def test_idle_advice_follows_the_scheduler():
    assert "scancel" in render("release_idle_gpu", {"job_kind": "slurm"}).text
    assert "kubectl scale" in render("release_idle_gpu", {"job_kind": "kubernetes"}).text
    assert (
        "--cpus-per-task"
        in render("more_cpu_cores", {"job_kind": "slurm", "num_workers": 8, "cpu_cores_allowed": 4}).text
    )
    assert "10 cores" in render("more_cpu_cores", {"num_workers": 8, "cpu_cores_allowed": 4}).text


def test_xid_tip_explains_the_common_codes():
    for code in (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95):
        meaning, _ = tips.XID_MEANINGS[code]
        assert f"Xid {code} ({meaning})" in render("xid_lookup", {"xid": code}).text
    assert "Xid catalog" in render("xid_lookup", {"xid": 4242}).text
    assert ids(tips_for(None, [Condition.XID_RECENT], {"xid": 119})) == ["xid_lookup", "update_driver_cuda"]


def test_remap_tip_tells_pending_from_failed():
    assert "next GPU reset" in render("row_remap", {"row_remap_pending": True}).text
    assert "RMA" in render("row_remap", {"row_remap_failure": True, "row_remap_pending": True}).text


# -- ranking ------------------------------------------------------------------------------------------------------


def test_input_cpu_saturated_puts_workers_then_pinning_first():
    assert ids(tips_for(Reason.INPUT_CPU_SATURATED, (), STARVED))[:2] == ["dataloader_workers", "pin_memory"]
    pinned = ids(tips_for(Reason.INPUT_CPU_SATURATED, (), {**STARVED, "pin_memory": True}))
    assert pinned[0] == "dataloader_workers" and "pin_memory" not in pinned


def test_saturated_workers_without_spare_cores_point_to_the_gpu_and_more_cores():
    evidence = {
        "num_workers": 15,
        "workers_cpu_ratio_max": 0.98,
        "cpu_cores_allowed": 16,
        "cpu_cores_used": 15.9,
        "data_wait_ratio": 0.35,
    }
    assert ids(tips_for(Reason.WORKERS_SATURATED, (), evidence))[:2] == ["gpu_preprocessing", "more_cpu_cores"]


def test_waiting_loaders_with_idle_cpus_point_to_storage():
    evidence = {"num_workers": 4, "workers_cpu_ratio_max": 0.1, "main_process_cpu_ratio": 0.2, "data_wait_ratio": 0.4}
    rendered = tips_for(Reason.INPUT_WAIT_REPORTED, (), evidence)
    assert rendered[0].id == "dataset_storage"
    assert "gpu_preprocessing" not in ids(tips_for(Reason.INPUT_WAIT_REPORTED, (), evidence, limit=50))


def test_low_sm_activity_with_autocast_off_ranks_mixed_precision_first():
    evidence = {"autocast": False, "tf32": False, "tensor_activity": 0.0, "memory_used_ratio": 0.3}
    ranked = ids(tips_for(Reason.LOW_SM_ACTIVITY, (), evidence))
    assert ranked[0] == "mixed_precision" and "tf32_matmul" in ranked
    assert "mixed_precision" not in ids(tips_for(Reason.LOW_SM_ACTIVITY, (), {**evidence, "autocast": True}))


def test_low_occupancy_ranks_batch_size_and_kernel_fusion_first():
    evidence = {"busy_ratio": 0.9, "sm_occupancy": 0.05, "memory_used_ratio": 0.2, "batch_size": 32}
    assert ids(tips_for(Reason.LOW_OCCUPANCY, (), evidence))[:2] == ["larger_batch", "torch_compile"]


def test_launch_bound_job_gets_sync_compile_and_graph_tips():
    assert set(ids(tips_for(Reason.LOW_BUSY_RATIO, (), LAUNCH_BOUND))) == {
        "host_device_sync",
        "torch_compile",
        "cuda_graphs",
    }


def test_the_jobs_own_wait_weighs_the_input_tips():
    # Below the verdict's starvation threshold the input is worth a look, not the answer: the verdict says
    # the GPU is not data-starved, so input tips must not lead.
    mild = {
        "busy_ratio": 0.3,
        "data_wait_ratio": 0.1,
        "num_workers": 0,
        "pin_memory": False,
        "main_process_cpu_ratio": 0.3,
    }
    assert not set(ids(tips_for(Reason.LOW_BUSY_RATIO, (), mild))) & {"dataloader_workers", "pin_memory"}
    assert "dataloader_workers" in ids(tips_for(Reason.LOW_BUSY_RATIO, (), mild, limit=50))
    starved = {**mild, "data_wait_ratio": 0.3}
    assert ids(tips_for(Reason.LOW_BUSY_RATIO, (), starved))[:2] == ["dataloader_workers", "pin_memory"]


def test_evidence_rules_tips_out():
    ready = {"data_wait_ratio": 0.01, "num_workers": 0, "pin_memory": False}
    offered = set(ids(tips_for(Reason.LOW_BUSY_RATIO, (), ready, limit=50)))
    assert not offered & {"dataloader_workers", "pin_memory", "dataloader_prefetch", "dataset_storage"}
    assert "tf32_matmul" not in ids(tips_for(Reason.HEALTHY, (), {"model": "Tesla V100-SXM2-32GB"}, limit=50))
    assert "tf32_matmul" not in ids(tips_for(Reason.HEALTHY, (), {"tf32": True}, limit=50))
    assert "right_size_gpu" not in ids(tips_for(Reason.LOW_SM_ACTIVITY, (), {"memory_used_ratio": 0.9}, limit=50))
    assert "allocator_fragmentation" not in ids(tips_for(Reason.HEALTHY, (), {}, limit=50))
    assert ids(tips_for(Reason.HEALTHY, (), {"alloc_retries": 5}))[0] == "allocator_fragmentation"


def test_spinning_kernel_and_idle_reasons():
    assert ids(tips_for(Reason.SPINNING_KERNEL, (), {"busy_ratio": 1.0, "sm_activity": 0.01}))[0] == "debug_hang"
    assert ids(tips_for(Reason.NO_KERNELS, (), {}))[0] == "release_idle_gpu"
    assert "unused_gpu_request" in ids(tips_for(Reason.ALLOCATED_NO_PROCESS, (), {}))
    assert ids(tips_for(Reason.GPU_LOST, [Condition.LOST], {})) == ["gpu_fell_off_bus"]
    assert ids(tips_for(Reason.GPU_UNREADABLE, [], {})) == ["gpu_unreadable"]


def test_condition_tips_follow_the_reasons_and_keep_a_place():
    conditions = [Condition.THERMAL_THROTTLE, Condition.ECC_UNCORRECTED]
    assert ids(tips_for(Reason.HEALTHY, conditions, {"autocast": False})) == [
        "mixed_precision",
        "ecc_uncorrected",
        "thermal_throttle",
    ]
    everything = ids(tips_for(Reason.HEALTHY, conditions, {"autocast": False}, limit=50))
    assert everything[-2:] == ["ecc_uncorrected", "thermal_throttle"]
    assert ids(tips_for(Reason.HEALTHY, conditions, {"autocast": False}, limit=1)) == ["mixed_precision"]
    ordered = ids(tips_for(None, list(Condition), {}, limit=50))
    assert ordered[:4] == ["gpu_fell_off_bus", "ecc_uncorrected", "row_remap", "xid_lookup"]
    assert len(ordered) == len(set(ordered))


def test_strings_and_enums_are_the_same_and_limits_hold():
    evidence = {"autocast": False, "memory_used_ratio": 0.2}
    assert tips_for("low_sm_activity", ["pcie_degraded"], evidence) == tips_for(
        Reason.LOW_SM_ACTIVITY, [Condition.PCIE_DEGRADED], evidence
    )
    assert tips_for(Reason.LOW_SM_ACTIVITY, "pcie_degraded", evidence) == tips_for(
        Reason.LOW_SM_ACTIVITY, ["pcie_degraded"], evidence
    )
    for limit in (0, -1, 1, 2, 5):
        assert len(tips_for(Reason.LOW_SM_ACTIVITY, [Condition.PCIE_DEGRADED], evidence, limit=limit)) == max(limit, 0)


def test_unknown_values_are_ignored_and_unknown_ids_named():
    assert tips_for("no_such_reason", ["no_such_condition"], {}) == []
    assert tips_for(None, None, None) == []
    with pytest.raises(KeyError, match="no tip with id 'nope'; known ids: dataloader_workers"):
        render("nope", {})


# -- arbitrary evidence ---------------------------------------------------------------------------------------------

_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
    st.sampled_from(["slurm", "kubernetes", "bfloat16", "float16", "NVIDIA H100 80GB HBM3", "Tesla T4", "None"]),
)


@settings(max_examples=300, deadline=None)
@given(
    evidence=st.dictionaries(st.one_of(st.sampled_from(EVIDENCE_KEYS), st.text(max_size=12)), _ANY_VALUE, max_size=25),
    reason=st.one_of(st.sampled_from(list(Reason)), st.none(), st.text(max_size=20)),
    conditions=st.lists(st.one_of(st.sampled_from(list(Condition)), st.text(max_size=12)), max_size=10),
    limit=st.integers(min_value=-2, max_value=60),
)
def test_arbitrary_evidence_never_raises(evidence, reason, conditions, limit):
    rendered = tips_for(reason, conditions, evidence, limit=limit)
    assert len(rendered) <= max(limit, 0)
    for tip_id in CATALOG:
        text = render(tip_id, evidence).text
        assert text and "{" not in text and "}" not in text


_RATIO = st.floats(min_value=0, max_value=1.5)
_WELL_TYPED = st.fixed_dictionaries(
    {},
    optional={
        **{
            key: _RATIO
            for key in (
                "busy_ratio",
                "sm_activity",
                "sm_occupancy",
                "tensor_activity",
                "dram_bandwidth",
                "power_ratio",
                "memory_used_ratio",
                "data_wait_ratio",
                "main_process_cpu_ratio",
                "workers_cpu_ratio_max",
            )
        },
        **{
            key: st.integers(min_value=0, max_value=512)
            for key in (
                "num_workers",
                "prefetch_factor",
                "batch_size",
                "alloc_retries",
                "ooms",
                "processes",
                "xid",
                "ecc_uncorrected",
                "pcie_generation",
                "pcie_max_generation",
                "pcie_width",
                "pcie_max_width",
            )
        },
        **{
            key: st.booleans()
            for key in (
                "pin_memory",
                "persistent_workers",
                "autocast",
                "tf32",
                "row_remap_pending",
                "row_remap_failure",
            )
        },
        **{
            key: st.floats(min_value=0, max_value=1e7)
            for key in (
                "cpu_cores_allowed",
                "cpu_cores_used",
                "idle_seconds",
                "held_seconds",
                "steps_per_second",
                "temperature_celsius",
            )
        },
        **{
            key: st.integers(min_value=0, max_value=2**40)
            for key in ("torch_reserved_bytes", "torch_allocated_bytes", "memory_total_bytes")
        },
        "model": st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB", "NVIDIA L4", "Some GPU"]),
        "autocast_dtype": st.sampled_from(["bfloat16", "float16"]),
        "job_kind": st.sampled_from(["slurm", "kubernetes", "container", "process"]),
    },
)


@settings(max_examples=300, deadline=None)
@given(evidence=_WELL_TYPED)
def test_well_typed_evidence_renders_clean_sentences(evidence):
    for tip_id in CATALOG:
        text = render(tip_id, evidence).text
        assert (text[0].isupper() or text[0].isdigit() or text[0] == "`") and text.endswith("."), text
        assert not FORBIDDEN.search(text), text
        assert "::" not in text and ": :" not in text
    for reason in Reason:
        for rendered in tips_for(reason, list(Condition), evidence, limit=60):
            assert CATALOG[rendered.id].score(tips.Facts(evidence)) > 0


def test_facts_reject_what_is_not_evidence():
    facts = tips.Facts({"a": math.nan, "b": -1, "c": True, "d": 10**400, "e": "x{y}", "f": "None", "g": "  H100 "})
    assert [facts.number(k) for k in "abcd"] == [None, None, None, None]
    assert facts.flag("c") is True and facts.count("c") is None
    assert facts.text("e") is None and facts.text("f") is None and facts.text("g") == "H100"
    assert tips.Facts(["not", "a", "mapping"]).number("a") is None  # type: ignore[arg-type]


# -- every tip's text and score, kept ------------------------------------------------------------------------------

# Regenerate after an intended change to a tip with GPULENS_UPDATE_GOLDEN=1 and review the diff.
GOLDEN = Path(__file__).resolve().parent / "golden" / "tips.json"

# Named evidence sets, each reaching branches the others do not: an older GPU, Kubernetes, a remap that
# failed, a job whose wait for batches is mild, one with prefetching already deep.
CONTEXTS = {
    "empty": {},
    "all_none": dict.fromkeys(EVIDENCE_KEYS),
    "starved": STARVED,
    "heavy": HEAVY,
    "light": LIGHT,
    "launch_bound": LAUNCH_BOUND,
    # The same jobs after `gpulens trace`: the tips cite what the trace showed.
    "starved_traced": {**STARVED, "trace_steps": 20, "trace_data_wait_ratio": 0.71, "trace_host_ratio": 0.09},
    "launch_bound_traced": {**LAUNCH_BOUND, "trace_steps": 20, "trace_data_wait_ratio": 0.02, "trace_host_ratio": 0.64},
    "older_gpu": {
        "model": "Tesla V100-SXM2-32GB",
        "autocast": True,
        "autocast_dtype": "float16",
        "tf32": False,
        "xid": 48,
        "ecc_uncorrected": 1,
        "power_ratio": 0.97,
        "job_kind": "kubernetes",
        "num_workers": 8,
        "cpu_cores_allowed": 32,
        "cpu_cores_used": 30,
        "idle_seconds": 45,
        "memory_used_ratio": 0.3,
    },
    "remap_failed": {
        "row_remap_failure": True,
        "xid": 4242,
        "pcie_width": 8,
        "pcie_max_width": 16,
        "temperature_celsius": 70,
        "processes": 1,
        "held_seconds": 600,
        "job_kind": "process",
    },
    "mild_wait": {
        "busy_ratio": 0.3,
        "data_wait_ratio": 0.1,
        "num_workers": 0,
        "pin_memory": False,
        "main_process_cpu_ratio": 0.3,
        "workers_cpu_ratio_max": 0.2,
        "persistent_workers": True,
        "prefetch_factor": 8,
        "memory_used_ratio": 0.05,
        "memory_total_bytes": 24 * GIB,
        "batch_size": 1,
    },
}


def _sweep(count: int = 200, seed: int = 7) -> list[dict]:
    """Return `count` evidence sets drawn from a fixed seed, well typed and not, for every key."""
    rng = random.Random(seed)
    odd = [None, True, False, -1, math.nan, math.inf, "None", "x{y}", 2.5, 10**30]
    values = {
        "model": ["NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA L4", "Some GPU"],
        "job_kind": ["slurm", "kubernetes"],
        "autocast_dtype": ["bfloat16", "float16"],
        "xid": sorted(tips.XID_MEANINGS) + [7],
    }
    sets = []
    for _ in range(count):
        evidence = {}
        for key in EVIDENCE_KEYS:
            pick = rng.random()
            if pick < 0.4:
                continue
            if pick < 0.5:
                evidence[key] = rng.choice(odd)
            elif key in values:
                evidence[key] = rng.choice(values[key])
            elif key.endswith(("_ratio", "_activity", "_occupancy", "_bandwidth")):
                evidence[key] = round(rng.random() * 1.2, 3)
            elif key in (
                "pin_memory",
                "persistent_workers",
                "autocast",
                "tf32",
                "row_remap_pending",
                "row_remap_failure",
            ):
                evidence[key] = rng.random() < 0.5
            else:
                evidence[key] = rng.choice([0, 1, 2, 3, 4, 5, 8, 16, 64, 90, 3600, 9000, 2**34, 80 * GIB, 6.5])
        sets.append(evidence)
    return sets


def _written(evidence) -> dict:
    """Return what the catalog makes of `evidence`: each tip's score and text, and each reason's ranking."""
    facts = tips.Facts(evidence)
    return {
        "tips": {tip_id: [tip.score(facts), render(tip_id, evidence).text] for tip_id, tip in CATALOG.items()},
        "ranked": {str(reason): ids(tips_for(reason, (), evidence, limit=50)) for reason in Reason},
        "conditions": ids(tips_for(Reason.LOW_BUSY_RATIO, list(Condition), evidence, limit=50)),
    }


def _golden() -> dict:
    sweep = [json.dumps(_written(evidence), sort_keys=True) for evidence in _sweep()]
    return {
        "catalog": [
            [tip.id, tip.title, list(tip.applies_to), list(tip.docs), tip.when, list(tip.reads)]
            for tip in CATALOG.values()
        ],
        "contexts": {name: _written(evidence) for name, evidence in CONTEXTS.items()},
        "sweep_sha256": [hashlib.sha256(text.encode()).hexdigest()[:16] for text in sweep],
    }


def test_every_tip_writes_and_scores_as_kept():
    got = json.loads(json.dumps(_golden()))
    if os.environ.get("GPULENS_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got["catalog"] == want["catalog"]
    for name in CONTEXTS:
        assert got["contexts"][name] == want["contexts"][name], name
    changed = [i for i, (a, b) in enumerate(zip(got["sweep_sha256"], want["sweep_sha256"], strict=True)) if a != b]
    assert not changed, f"evidence sets {changed} of the sweep render differently: {_sweep()[changed[0]]}"


@pytest.mark.parametrize("tip_id", sorted(CATALOG))
def test_no_tip_speaks_in_metric_names(tip_id):
    # A tip is read by the person paged and the job's owner, on a page that has the states already.
    for evidence in ({}, HEAVY, LIGHT):
        assert "gpulens_" not in render(tip_id, evidence).text, tip_id
