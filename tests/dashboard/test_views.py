"""The pages' logic, without Streamlit: filters, counts, flagged order, tips, timelines, jobs, probes, alerts."""

from __future__ import annotations

import re
from dataclasses import asdict, replace

import pytest

from gpulens import links, words
from gpulens.dashboard import charts
from gpulens.dashboard.views import alerts, fleet, gpu, job, oncall, probes
from gpulens.fleet import advice
from gpulens.fleet.records import LOST_STATE, FiringAlert, FleetGpu, GpuHistory, Holder, JobSummary, ProbeResult
from gpulens.report import charts as report_charts
from gpulens.usage import STATES, TimelinePoint
from gpulens.vocabulary import STATE_COLOUR
from tests.dashboard.fakes import GPUS, JOBS, MIG_GPU, NOW, PAST, history, mig_history


def test_filters_keep_only_matching_gpus_and_options_are_distinct_and_sorted():
    options = fleet.filter_options(GPUS)
    assert options.nodes == ("node-a", "node-b")
    assert options.users == ("alice", "bob", "carol")
    assert options.namespaces == ("research", "vision")
    assert [g.gpu for g in fleet.apply(GPUS, fleet.Filters(nodes=("node-b",)))] == ["0", "1"]
    assert fleet.apply(GPUS, fleet.Filters(users=("bob",), models=("NVIDIA A100-SXM4-80GB",))) == []
    assert len(fleet.apply(GPUS, fleet.Filters())) == 4


def test_a_gpu_two_jobs_share_is_each_jobs_and_passes_a_filter_on_either_owner():
    dan = Holder("slurm", "9001", "dan", account="physics")
    shared = replace(GPUS[1], holders=(*GPUS[1].holders, dan))
    gpus = (GPUS[0], shared)
    assert fleet.job_gpus(gpus, "slurm", "9001") == fleet.job_gpus(gpus, "kubernetes", "job-bob") == [shared]
    assert fleet.filter_options(gpus).users == ("alice", "bob", "dan")
    assert fleet.apply(gpus, fleet.Filters(users=("dan",))) == [shared]
    assert fleet.apply(gpus, fleet.Filters(users=("dan",), namespaces=("research",))) == [shared]
    (row,) = fleet.flagged(gpus, NOW)
    assert (row.job, row.owner) == ("kubernetes pod jupyter-bob, slurm 9001", "bob / research, dan")
    # An allocation series without a job (a store's answer gone wrong) adds no empty name.
    assert replace(shared, holders=(*shared.holders, Holder())).job_names == row.job
    assert row.job_links == (
        ("kubernetes pod jupyter-bob", "job?kind=kubernetes&id=job-bob"),
        ("slurm 9001", "job?kind=slurm&id=9001"),
    )
    # The job page names each job's own owner, whichever holds the GPU first.
    assert job.whose(JobSummary("slurm", "9001", {}, ("node-a",)), [shared]).startswith(
        "Owner: user **dan**; account **physics**"
    )
    (listed,) = job.job_list([JobSummary("slurm", "9001", {"idle": 60.0}, ("node-a",))], gpus)
    assert (listed["user"], listed["GPUs now"]) == ("dan", 1)
    assert [r["job"] for r in gpu.holder_rows(shared, history())] == ["job-bob", "9001"]
    # The device's memory is every job's on it: said so, not shown as the job's own.
    assert job.memory(JobSummary("slurm", "9001", {}, ("node-a",)), [shared]).device_label.endswith(", shared")
    assert job.memory(JobSummary("kubernetes", "job-bob", {}, ()), [GPUS[1]]).device_label == "Device memory in use"


def test_state_counts_list_every_state_wasted_first():
    counts = fleet.state_counts(GPUS)
    assert [c.state for c in counts] == ["idle", "data_starved", "underutilized", "busy", "free", "unknown", "lost"]
    assert [c.count for c in counts] == [1, 1, 0, 1, 1, 0, 0]


def test_health_counts_include_gpus_that_do_not_answer():
    lost = FleetGpu(node="n", gpu="3", uuid="u", up=False, state="unknown", reason="gpu_lost")
    assert fleet.health_counts([*GPUS, lost]) == [("not answering", 1), ("slowed down by heat", 1)]


def test_flagged_are_wasted_or_unhealthy_sorted_by_wasted_time_then_age():
    rows = fleet.flagged(GPUS, NOW)
    assert [(r.node, r.gpu) for r in rows] == [("node-a", "1"), ("node-b", "0"), ("node-b", "1")]
    first = rows[0]
    assert first.for_how_long == "1 h 30 min" and first.owner == "bob / research"
    assert first.job == "kubernetes pod jupyter-bob" and first.link == "gpu?node=node-a&gpu=1"
    assert first.tips[0].id == "release_idle_gpu"
    # Same waste: the one in its state longer comes first.
    a = replace(GPUS[1], node="x", wasted_seconds=0, since=NOW - 10)
    b = replace(GPUS[1], node="y", wasted_seconds=0, since=NOW - 1000)
    assert [r.node for r in fleet.flagged([a, b], NOW)] == ["y", "x"]


def test_a_gpu_unknown_for_a_fault_is_flagged_and_one_unknown_for_a_moment_or_by_design_is_not():
    """A held GPU whose process list could not be read was left out of the flagged list, and its page said that
    nobody held it."""
    unread = replace(GPUS[3], state="unknown", reason="processes_unknown", holders=(), since=NOW - 120, conditions=())
    (row,) = fleet.flagged([unread], NOW)
    assert row.why == words.reason_text("processes_unknown")
    assert gpu.no_holder_text(unread).startswith("Not known: the driver would not list its processes")
    assert oncall.holders(unread).startswith("not known") and oncall.holders(GPUS[3]) == "no job"
    assert oncall.contact(unread)[0][1].startswith("not known: the driver would not list its processes")
    assert gpu.no_holder_text(GPUS[3]) == "No job or process holds this GPU."
    for reason in ("no_data", "mig_enabled", "mig_no_activity"):
        assert fleet.flagged([replace(unread, reason=reason)], NOW) == []


def test_gpu_tips_put_the_agents_pick_first_then_the_catalogs_without_repeats():
    tips = advice.gpu_tips(GPUS[2])
    assert [t.id for t in tips][0] == "dataloader_workers"
    assert len({t.id for t in tips}) == len(tips) == 2
    assert "72%" in tips[0].text  # written with the evidence
    # An unknown tip id (a newer agent) falls back to the catalog's own choice for the reason.
    assert advice.gpu_tips(replace(GPUS[1], tip="from_a_newer_agent"))[0].id == "release_idle_gpu"
    # A health condition gets its tip even on a busy GPU.
    hot = replace(GPUS[0], conditions=("thermal_throttle",))
    assert "thermal_throttle" in [t.id for t in advice.gpu_tips(hot)]


def test_heatmap_rows_name_state_reason_and_owner_in_words():
    row = fleet.heatmap_rows([GPUS[3]])[0]
    assert row == {
        "node": "node-b",
        "gpu": "GPU 1",
        "start": 0.0,
        "end": 1.0,
        "slice": "",
        "state": "Free",
        "reason": "no process on it",
        "owner": "nobody",
        "model": "NVIDIA A100-SXM4-80GB",
        "link": "gpu?node=node-b&gpu=1",
    }


def test_a_click_on_a_square_of_the_map_opens_its_gpu_or_its_node():
    # Vega-Lite's href channel: the browser follows the square's link, relative to the Fleet page.
    gpu_map = charts.heatmap(fleet.heatmap_rows(GPUS))[0].to_dict()
    node_map = charts.node_map(fleet.node_map_rows(GPUS))[0].to_dict()
    for chart in (gpu_map, node_map):
        assert chart["encoding"]["href"] == {"field": "link", "type": "nominal"}
        assert chart["mark"]["cursor"] == "pointer"
    assert {row["link"] for row in fleet.node_map_rows(GPUS)} == {"gpu?node=node-a", "gpu?node=node-b"}


def test_words_give_plain_names():
    assert words.state_name("data_starved") == "Starved for data"
    assert words.evidence_text({"busy_ratio": 0.27, "data_wait_ratio": 0.72, "idle_seconds": 30}) == (
        "work running 27% of the time; job waits for data 72% of each step"
    )
    assert words.job_label("docker", "3f2a9c1e7b5d4a60e8f1c2b3") == "docker 3f2a9c1e7b5d…"


def test_chart_rows_scale_to_the_axis_unit_and_name_missing_lines():
    data = history()
    memory = next(spec for spec in gpu.CHARTS if spec.title == "Memory")
    rows = gpu.chart_rows(data, memory)
    assert {r["series"] for r in rows} == {"device memory in use (all processes)", "device memory size"}
    assert max(r["value"] for r in rows) == 80.0  # GiB
    assert gpu.missing_lines(data, memory) == ["PyTorch: held by tensors", "PyTorch: reserved by its cache"]


def _pcie(*values: float) -> GpuHistory:
    points = tuple((NOW - 10 * i, v) for i, v in enumerate(values))
    return GpuHistory("n", "0", NOW - 600, NOW, {"pcie_receive_bytes_per_second": points}, ())


@pytest.mark.parametrize(
    ("values", "axis", "top"),
    [
        ((0.0, 0.0), "B/s", 0.0),  # an idle link: zeros, on a plain axis
        ((4_000.0, 12_500.0), "kB/s", 12.5),  # a few kB/s, once 0.0000125 GB/s
        ((2e8, 1.2e10), "GB/s", 12.0),
    ],
)
def test_the_pcie_chart_takes_the_unit_its_largest_value_calls_for(values, axis, top):
    spec = next(spec for spec in gpu.CHARTS if spec.title == "PCIe traffic")
    data = _pcie(*values)
    assert gpu.axis_title(data, spec) == axis
    assert max(r["value"] for r in gpu.chart_rows(data, spec)) == pytest.approx(top)
    power = next(spec for spec in gpu.CHARTS if spec.title == "Power")
    assert gpu.axis_title(history(), power) == "watts"  # a chart with a fixed unit keeps it


def test_value_axes_write_plain_numbers_from_zero_to_at_least_one():
    # Without a format Vega-Lite took the digits from the tick step, and a flat line at zero read "0.000000".
    chart, _ = charts.lines([{"time": NOW, "series": "host → GPU", "value": 0.0}], "B/s", NOW - 60, NOW)
    y = chart.to_dict()["encoding"]["y"]
    assert y["axis"]["format"] == ",.3~r" and y["title"] == "B/s"
    assert y["scale"]["domain"] == {"unionWith": [0, 1]}
    tooltip = chart.to_dict()["encoding"]["tooltip"]
    assert {t.get("format") for t in tooltip if t["field"] == "value"} == {",.3~r"}


def test_a_short_jobs_hours_are_drawn_in_gpu_minutes():
    small, _ = charts.shares([{"state": "Busy", "hours": 0.01, "share": 1.0}])
    spec = small.to_dict()
    assert spec["encoding"]["x"]["title"] == "GPU-minutes" and spec["encoding"]["x"]["axis"]["format"] == ",.3~r"
    assert next(iter(spec["datasets"].values()))[0]["amount"] == pytest.approx(0.6)
    large, _ = charts.shares([{"state": "Busy", "hours": 12.0, "share": 1.0}])
    assert large.to_dict()["encoding"]["x"]["title"] == "GPU-hours"


def test_timeline_merges_runs_of_one_state():
    data = GpuHistory("n", "0", 0.0, 100.0, {}, ((10.0, "busy"), (20.0, "busy"), (30.0, "idle"), (40.0, "idle")))
    segments = gpu.timeline(data)
    assert [(s.state, s.start.timestamp(), s.end.timestamp()) for s in segments] == [
        ("Busy", 10.0, 30.0),
        ("Idle (held, no work)", 30.0, 100.0),
    ]


def test_span_starts_where_the_samples_do():
    data = GpuHistory("n", "0", 0.0, 3600.0, {"power_watts": ((3000.0, 1.0), (3500.0, 2.0))}, ((3100.0, "busy"),))
    assert [t.timestamp() for t in gpu.span(data)] == [3000.0, 3600.0]
    full = GpuHistory("n", "0", 0.0, 3600.0, {"power_watts": ((-50.0, 1.0),)}, ())
    assert [t.timestamp() for t in gpu.span(full)] == [0.0, 3600.0]
    assert [t.timestamp() for t in gpu.span(GpuHistory("n", "0", 0.0, 3600.0, {}, ()))] == [0.0, 3600.0]
    # A GPU in MIG mode whose slices alone have samples: its axis starts where theirs do.
    part = GpuHistory("n", "0", 0.0, 3600.0, {}, ((3200.0, "busy"),), uuid="MIG-1", mig_profile="1g.10gb")
    split = GpuHistory("n", "0", 0.0, 3600.0, {}, (), slices=(part,))
    assert [t.timestamp() for t in gpu.span(split)] == [3200.0, 3600.0]


SLICE_ROWS = [
    "GPU 2 · 3g.40gb slice",
    "GPU 2 · 2g.20gb slice",
    "GPU 2 · 1g.10gb slice (MIG-c2-3)",  # two slices of one profile: told apart by their UUIDs
    "GPU 2 · 1g.10gb slice (MIG-c2-4)",
]


def test_a_mig_gpus_timeline_has_a_row_per_slice_and_none_for_the_gpus_unknown():
    data = mig_history()
    segments = gpu.timeline(data)
    assert [(s.row, s.state) for s in segments] == [
        (SLICE_ROWS[0], "Busy"),
        (SLICE_ROWS[1], "Idle (held, no work)"),
        (SLICE_ROWS[2], "Underused"),
        (SLICE_ROWS[3], "Free"),
    ]
    assert segments[3].start.timestamp() == pytest.approx(NOW - 300)  # created five minutes in
    chart, height = charts.timeline([asdict(s) for s in segments], *gpu.span(data))
    y = chart.to_dict()["encoding"]["y"]
    assert (y["field"], y["sort"], height) == ("row", SLICE_ROWS, 110 + 40 * 4)
    # A GPU out of MIG mode keeps its one row, as high as before.
    plain = gpu.timeline(history())
    assert {s.row for s in plain} == {"GPU 1"}
    assert charts.timeline([asdict(s) for s in plain], *gpu.span(history()))[1] == 150


def test_a_mig_gpu_that_fell_off_the_bus_keeps_its_own_row_with_its_loss():
    data = mig_history()
    lost = replace(data, states=data.states[:40] + tuple((t, LOST_STATE) for t, _ in data.states[40:]))
    segments = gpu.timeline(lost)
    assert [(s.row, s.state) for s in segments[:2]] == [("GPU 2", "Unknown"), ("GPU 2", "Lost")]
    assert [s.row for s in segments[2:]] == SLICE_ROWS


def test_a_destroyed_slices_row_ends_where_its_history_does():
    data = mig_history()
    kept = data.slices[0].states[:40]  # its last sample 210 s ago; the next reading of its GPU found it gone
    gone = replace(data.slices[0], states=kept, end=kept[-1][0] + 10)
    (segment,) = gpu.timeline(replace(data, slices=(gone,)))
    assert segment.end.timestamp() == pytest.approx(NOW - 200)


def test_a_mig_gpus_charts_draw_each_slices_activity_and_memory():
    data = mig_history()
    work, memory = (
        next(spec for spec in gpu.CHARTS if spec.title == title) for title in ("Is the GPU working?", "Memory")
    )
    rows = gpu.chart_rows(data, work)
    assert {r["series"] for r in rows} == {f"{row}: compute units busy (SM activity)" for row in SLICE_ROWS}
    assert max(r["value"] for r in rows) == pytest.approx(70.0)  # the busy 3g.40gb slice, in %
    # Lines the GPU lacks but its slices draw are not missing.
    assert gpu.missing_lines(data, work) == [
        "work running (driver's utilization, last second)",
        "work running (exact, averaged between samples)",
    ]
    used = {r["series"]: r["value"] for r in gpu.chart_rows(data, memory)}
    assert used["device memory in use (all processes)"] == 20.0  # the GPU's own line, then each slice's
    assert used["GPU 2 · 2g.20gb slice: device memory in use (all processes)"] == 5.0
    assert used["GPU 2 · 2g.20gb slice: device memory size"] == 20.0


def test_a_mig_gpu_without_activity_per_slice_says_why_its_work_chart_is_empty():
    # An A100 in MIG mode: no utilization, and no SM activity per slice before Hopper.
    data = mig_history()
    ampere = replace(
        data,
        slices=tuple(
            replace(s, series={k: v for k, v in s.series.items() if k != "sm_activity_ratio"}) for s in data.slices
        ),
    )
    work = gpu.CHARTS[0]
    assert gpu.chart_rows(ampere, work) == []
    assert gpu.empty_text(ampere, work).startswith("Nothing tells how busy this GPU's MIG slices are")
    assert gpu.empty_text(history(), work) == "No samples in this range."  # a GPU out of MIG mode


def test_a_mig_gpus_timeline_says_why_the_gpu_itself_is_unknown():
    assert gpu.mig_note(MIG_GPU, mig_history()) == (
        "GPU 2's own state is unknown: in MIG mode its slices are judged one by one, each on a row of its own."
    )
    assert gpu.mig_note(MIG_GPU, replace(mig_history(), slices=())).endswith(
        "and this source has no state of them in this range yet."
    )
    assert gpu.mig_note(GPUS[1], history()) == ""


def test_node_rows_and_holder():
    rows = gpu.node_rows(GPUS, "node-b", NOW)
    assert [r["GPU"] for r in rows] == ["0", "1"] and rows[1]["health"] == "slowed down by heat"
    assert gpu.holder_rows(GPUS[1], history())[0]["processes on the GPU"] == "1"
    assert gpu.holder_rows(GPUS[3], GpuHistory("n", "1", 0, 1, {}, ())) == []


def test_job_list_breakdown_data_wait_memory_and_tips():
    rows = job.job_list(JOBS, GPUS)
    assert [r["id"] for r in rows][0] == "job-bob"  # 1.5 GPU-h wasted of 1.67
    assert rows[0]["link"] == "job?kind=kubernetes&id=job-bob"
    starved = JOBS[1]
    held = job.job_gpus(GPUS, "slurm", "81234")
    assert [(s.state, round(s.share, 3)) for s in job.state_breakdown(starved)] == [
        ("Starved for data", 0.857),
        ("Busy", 0.143),
    ]
    assert job.data_wait(starved, held) == 0.72
    # Without the job's own report, its GPUs' evidence stands in.
    assert job.data_wait(replace(starved, data_wait_ratio=None), held) == 0.72
    assert job.data_wait(JOBS[2], []) is None
    memory = job.memory(starved, held)
    assert memory.device_used_bytes == 30 * 2**30 and memory.torch_reserved_bytes == 28 * 2**30
    assert job.job_tips(held, "slurm")[0][0] == "Add DataLoader workers"


def test_a_link_may_name_a_kubernetes_job_by_its_pod():
    assert job.pod_job(GPUS, "kubernetes", "jupyter-bob") == ("kubernetes", "job-bob")
    assert job.pod_job(GPUS, "", "research/jupyter-bob") == ("kubernetes", "job-bob")
    assert job.pod_job(GPUS, "slurm", "jupyter-bob") is None  # a Slurm job has no pod
    assert job.pod_job(GPUS, "kubernetes", "vision/jupyter-bob") is None  # another namespace's
    assert job.pod_job([MIG_GPU], "", "nlp/llm-ft-0") == ("kubernetes", "llm-ft")  # a pod that holds a MIG slice


@pytest.mark.parametrize(
    ("kind", "job_id", "index"),
    [
        ("slurm", "81234", 1),
        ("", "81234", 1),  # a link without a kind finds the job by its id
        ("kubernetes", "81234", None),  # the id, but of another kind
        ("slurm", "424242", None),  # not running: no other job in its place
        ("", "", 0),  # no link: the most wasted job
    ],
)
def test_a_link_names_its_running_job_or_none(kind, job_id, index):
    keys = [(r["kind"], r["id"]) for r in job.job_list(JOBS, GPUS)]
    assert keys[1] == ("slurm", "81234")
    assert job.linked(keys, kind, job_id) == index
    assert job.linked([], "", "") is None


def test_what_a_source_still_has_of_a_job_that_is_not_running():
    text = job.past_summary(PAST, NOW)
    assert "Last seen **" in text and "(3 h ago)**" in text and "first seen" in text and "(4 h ago)" in text
    assert f"Last seen **{words.when(PAST.last_seen)} (3 h ago)**" in text  # in UTC, as every page writes times
    assert "on node-b." in text and "Owner: carol." in text
    assert "held for **2.00 GPU-h**, of which **1.50 GPU-h wasted** (75%" in text
    assert "kernel ran" not in text  # no utilization samples in this record
    assert "A kernel ran 40% of" in job.past_summary(replace(PAST, busy_seconds=40.0, sampled_seconds=100.0), NOW)
    assert "no GPU time" in job.past_summary(replace(PAST, state_seconds={}), NOW)
    assert [s.state for s in job.state_breakdown(PAST)] == ["Starved for data", "Busy"]
    rows = job.past_gpu_rows(PAST, [*GPUS, MIG_GPU])
    assert rows[0] == {
        "GPU": "node-b GPU 0",
        "model": "NVIDIA A100-SXM4-80GB",
        "now": "Starved for data, held by slurm 81234",
        "details": "gpu?node=node-b&gpu=0",
    }
    assert rows[1] == {"GPU": "GPU-gone", "model": "", "now": "not in the fleet now", "details": None}
    (mig,) = job.past_gpu_rows(replace(PAST, gpus=("MIG-c2-4",)), [MIG_GPU])
    assert mig["GPU"] == "node-c GPU 2 · 1g.10gb slice" and mig["now"] == "Free"


def test_report_link_follows_the_template_or_is_absent():
    assert links.report_url("https://r.example/{job_kind}/{job_id}", "slurm", "a/b") == "https://r.example/slurm/a%2Fb"
    assert links.report_url("", "slurm", "1") is None
    assert links.report_url("https://r.example/{nope}", "slurm", "1") is None
    assert links.report_url("javascript:alert(1)//{job_id}", "slurm", "1") is None
    assert links.report_command("81234", prometheus="http://p:9090") == (
        "gpulens report job 81234 --prometheus http://p:9090 --format html -o report.html"
    )
    assert links.report_command("a b", agents="n1=http://a:1,http://b:2") == (
        "gpulens report job 'a b' --agent http://a:1 --agent http://b:2 --format html -o report.html"
    )


def test_probe_rows_compare_with_spec_and_fleet_median_outliers_first():
    results = [
        ProbeResult("a", "0", "u0", "H100", "matmul bf16", "FLOP/s", 780e12, 0.79, NOW - 60),
        ProbeResult("a", "1", "u1", "H100", "matmul bf16", "FLOP/s", 790e12, 0.80, NOW - 60),
        ProbeResult("b", "0", "u2", "H100", "matmul bf16", "FLOP/s", 600e12, 0.61, NOW - 60),
        ProbeResult("c", "0", "u3", "A100", "matmul bf16", "FLOP/s", 290e12, 0.93, None),
    ]
    rows = probes.probe_rows(results, NOW)
    assert (rows[0].node, rows[0].outlier) == ("b", True)
    assert round(rows[0].of_fleet_median, 3) == round(600 / 780, 3)
    assert rows[0].measured == "600.0 TFLOP/s" and rows[0].last_run == "1 min ago"
    assert [r.outlier for r in rows[1:]] == [False, False, False]
    assert next(r for r in rows if r.node == "c").of_fleet_median is None  # alone with its model
    spec_low = ProbeResult("d", "0", "u", "T4", "bandwidth d2d", "B/s", 100e9, 0.3, None)
    assert probes.probe_rows([spec_low], NOW)[0].outlier
    # Pageable and peer copies are shown, never judged: the host or the topology sets their pace.
    pageable = [ProbeResult("e", g, g, "H100", "bandwidth h2d pageable", "B/s", v, v / 63e9, None) for g, v in
                (("0", 25e9), ("1", 26e9), ("2", 12e9))]  # fmt: skip
    peers = [
        ProbeResult("f", g, g, "H100", "bandwidth p2p", "B/s", v, None, None) for g, v in (("0", 300e9), ("1", 150e9))
    ]
    assert not any(row.outlier for row in probes.probe_rows([*pageable, *peers], NOW))


def test_alert_rows_link_to_the_gpu_or_node():
    alert = FiringAlert("GpulensGpuIdle", "firing", "warning", "s", "d", "", "node-a", "1", NOW - 120)
    node_only = replace(alert, gpu="", node="node-b")
    rows = alerts.alert_rows([alert, node_only, replace(alert, node="", gpu="")], NOW)
    assert [r["link"] for r in rows] == ["gpu?node=node-a&gpu=1", "gpu?node=node-b", ""]
    assert rows[0]["for"] == "2 min" and rows[0]["where"] == "node-a GPU 1"


def test_only_the_first_flagged_rows_get_their_tips_written():
    rows = fleet.flagged(GPUS, NOW, detailed=1)
    assert rows[0].tips and rows[1].tips == () and rows[1].tip_title == "Add DataLoader workers"


def test_job_summary_defaults():
    assert JobSummary("slurm", "1", {}, ()).data_wait_ratio is None


def test_the_node_map_has_one_square_per_node_coloured_by_its_share_flagged():
    many = [replace(g, node=f"n{i:03d}") for i in range(40) for g in GPUS]  # 40 nodes of four GPUs, three flagged
    rows = fleet.node_map_rows(many)
    assert len(rows) == 40 and [r["column"] for r in rows[:3]] == [0, 1, 2]
    first = rows[0]
    assert (first["node"], first["GPUs"], first["flagged"], first["flagged share"]) == ("n000", 4, 3, 0.75)
    assert first["states"] == "1 busy, 1 idle (held, no work), 1 starved for data, 1 free"
    # Lines of NODE_MAP_COLUMNS nodes, each named by its first node.
    assert rows[fleet.NODE_MAP_COLUMNS]["line"] == rows[-1]["line"] == f"n{fleet.NODE_MAP_COLUMNS:03d}"
    assert rows[fleet.NODE_MAP_COLUMNS]["column"] == 0


def test_mig_slices_count_by_their_share_of_the_gpu():
    counts = {c.state: c.count for c in fleet.state_counts([*GPUS, MIG_GPU])}
    # The MIG GPU is its slices: 3/7 busy, 2/7 idle, 1/7 underused, 1/7 free; not one more unknown GPU.
    assert counts["idle"] == pytest.approx(1 + 2 / 7) and counts["underutilized"] == pytest.approx(1 / 7)
    assert counts["busy"] == pytest.approx(1 + 3 / 7) and counts["unknown"] == 0
    assert [words.count(counts[s]) for s in ("idle", "data_starved", "free")] == ["1.29", "1", "1.14"]
    # Time wasted in GPU-seconds: the idle 2g slice's 7200 s are 2/7 of a GPU's, the 1g slice's 3600 s 1/7.
    assert fleet.wasted_total([*GPUS, MIG_GPU]) == pytest.approx(5400 + 1800 + 7200 * 2 / 7 + 3600 / 7)


def test_wasted_mig_slices_are_flagged_by_name_holder_and_tip_ranked_by_their_share():
    rows = fleet.flagged([*GPUS, MIG_GPU], NOW)
    assert [f"{r.node} {r.name}" for r in rows] == [
        "node-a GPU 1",  # 5400 GPU-seconds
        "node-c GPU 2 · 2g.20gb slice",  # 7200 s of 2/7 of a GPU: 2057
        "node-b GPU 0",  # 1800
        "node-c GPU 2 · 1g.10gb slice",  # 3600 s of 1/7: 514
        "node-b GPU 1",  # hot, wastes nothing
    ]
    idle = rows[1]
    assert idle.wasted_seconds == pytest.approx(7200 * 2 / 7) and idle.link == "gpu?node=node-c&gpu=2"
    assert (idle.state, idle.owner, idle.job) == (
        "Idle (held, no work)",
        "eli / notebooks",
        "kubernetes pod jupyter-eli",
    )
    assert idle.tips[0].id == "release_idle_gpu" and "2 h" in idle.evidence
    # A GPU listed with its slices, as the page passes the flagged rows back, lists each slice once.
    assert len(fleet.flagged([*fleet.ranked([MIG_GPU]), MIG_GPU], NOW)) == 2


def test_a_slices_tips_know_its_profile():
    underused = MIG_GPU.slices[2]
    assert advice.tip_evidence(underused)["model"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"


def test_filters_narrow_a_mig_gpu_to_the_slices_that_pass():
    (only,) = fleet.apply([*GPUS, MIG_GPU], fleet.Filters(users=("eli",)))
    assert [s.mig_profile for s in only.slices] == ["2g.20gb"]
    assert "eli" in fleet.filter_options([MIG_GPU]).users
    assert fleet.apply([MIG_GPU], fleet.Filters(nodes=("node-c",))) == [MIG_GPU]
    assert fleet.apply([MIG_GPU], fleet.Filters(users=("nobody",))) == []


def test_the_map_splits_a_mig_gpus_square_into_its_slices_and_counts_them_by_share():
    rows = fleet.heatmap_rows([MIG_GPU])
    assert [(r["slice"], r["state"]) for r in rows] == [
        ("3g.40gb (43% of the GPU)", "Busy"),
        ("2g.20gb (29% of the GPU)", "Idle (held, no work)"),
        ("1g.10gb (14% of the GPU)", "Underused"),
        ("1g.10gb (14% of the GPU)", "Free"),
    ]
    assert rows[0]["start"] == 0 and rows[1]["start"] == pytest.approx(3 / 7) and rows[-1]["end"] == pytest.approx(1)
    assert rows[1]["owner"] == "eli / notebooks" and {r["gpu"] for r in rows} == {"GPU 2"}
    charts.heatmap(fleet.heatmap_rows([*GPUS, MIG_GPU]))[0].to_dict()  # draws
    (node,) = fleet.node_map_rows([MIG_GPU])
    assert (node["GPUs"], node["flagged"]) == (1, 0.43)  # the idle 2/7 and the underused 1/7
    assert node["states"] == "0.43 busy, 0.29 idle (held, no work), 0.14 underused, 0.14 free"


def test_gpu_view_lists_a_mig_gpus_slices():
    rows = gpu.slice_rows(MIG_GPU, NOW)
    assert [r["slice"] for r in rows] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    idle = rows[1]
    assert (idle["share of the GPU"], idle["state"], idle["owner"]) == (
        "29%",
        "Idle (held, no work)",
        "eli / notebooks",
    )
    assert idle["memory used"] == "5 GiB of 20 GiB" and idle["tip"] == "Give the idle GPU back"
    assert rows[3]["owner"] == "" and rows[3]["memory used"] == ""


def test_a_job_on_a_mig_slice_holds_its_share():
    held = job.job_gpus([*GPUS, MIG_GPU], "slurm", "88240")
    assert [h.mig_profile for h in held] == ["1g.10gb"]
    (row,) = job.job_list([JobSummary("slurm", "88240", {"underutilized": 3600 / 7}, ("node-c",))], [MIG_GPU])
    assert row["GPUs now"] == 0.14 and row["user"] == "fay"
    assert job.job_tips(held, "slurm")[0][2] == "node-c GPU 2 · 1g.10gb slice"


def test_failures_lead_the_flagged_list_whatever_their_waste():
    wasted = replace(GPUS[1], wasted_seconds=30 * 86400.0)  # a month of waste
    lost = FleetGpu(node="z", gpu="3", uuid="L", up=False, state="unknown", reason="gpu_lost", conditions=("lost",))
    ecc = replace(GPUS[0], node="y", uuid="E", conditions=("ecc_uncorrected",))
    throttled = replace(GPUS[0], node="x", uuid="T", conditions=("thermal_throttle",))
    order = [u.uuid for u in fleet.ranked([throttled, wasted, ecc, lost])]
    assert order[:2] == ["L", "E"], order  # gone, then broken memory; then waste, however small a failure's
    rows = fleet.summary_rows(fleet.flagged([throttled, wasted, ecc, lost], NOW)[:2])
    assert [r["GPU"] for r in rows] == ["z GPU 3", f"y GPU {ecc.gpu}"] and rows[0]["details"]


def test_state_counts_add_up_to_the_gpus_mig_slices_by_share():
    gpus = (*GPUS, MIG_GPU)
    counts = fleet.state_counts(gpus)
    assert sum(c.count for c in counts) == pytest.approx(len(gpus))
    covered = sum(s.share for s in MIG_GPU.slices)
    assert covered < 1  # the fake's MIG GPU leaves capacity uncarved, counted free


def test_a_lost_gpu_is_drawn_apart_from_the_unknown_ones():
    lost = FleetGpu(node="n", gpu="3", uuid="L", up=False, state="unknown", reason="gpu_lost", conditions=("lost",))
    starting = FleetGpu(node="n", gpu="4", uuid="S", state="unknown", reason="no_data")
    states = [row["state"] for row in fleet.heatmap_rows([lost, starting])]
    assert states == ["Lost", words.state_name("unknown")]
    chart, _ = charts.heatmap(fleet.heatmap_rows([lost, starting]))
    scale = chart.to_dict()["encoding"]["color"]["scale"]
    assert scale["range"][scale["domain"].index("Lost")] == STATE_COLOUR[LOST_STATE]


_BAR = re.compile(r'fill="(#[0-9a-f]{6})"><title>([^<]*?) \d\d-\d\d \d\d:\d\d</title>')
_KEY = re.compile(r'<i style="background:(#[0-9a-f]{6})"></i>([^<]*)</span>')


def test_the_html_report_draws_and_names_each_state_as_the_dashboard_does():
    chart, _ = charts.heatmap(fleet.heatmap_rows(GPUS))
    scale = chart.to_dict()["encoding"]["color"]["scale"]
    dashboard = dict(zip(scale["domain"], scale["range"], strict=True))  # state name -> colour
    legend = {name: colour for colour, name in _KEY.findall(report_charts.legend())}
    assert len(legend) == len(STATES) and legend == {name: dashboard[name] for name in legend}
    seconds = {state: 10.0 * (i + 1) for i, state in enumerate(STATES)}
    bars = _BAR.findall(report_charts.state_timeline([TimelinePoint(NOW, seconds, 0.0, 0.0, 0)]))
    assert sorted(bars) == sorted((dashboard[words.state_name(s)], words.state_name(s)) for s in STATES)


def test_a_lost_gpu_says_it_fell_off_the_bus_once():
    lost = FleetGpu(node="n", gpu="3", uuid="L", up=False, state="unknown", reason="gpu_lost", conditions=("lost",))
    [row] = fleet.flagged([lost], NOW)
    assert row.why.count("fell off the bus") == 1, row.why
    # Lost wherever its state is written: the summary, its card, its page's heading and its node's table.
    assert row.state == fleet.summary_rows([row])[0]["state"] == gpu.headline(lost) == "Lost"
    assert gpu.node_rows([lost], "n", NOW)[0]["state"] == "Lost"


def test_a_recent_xid_is_named_by_its_code_and_meaning():
    xid = replace(GPUS[0], conditions=("xid_recent",), evidence={**GPUS[0].evidence, "xid": 79.0})
    [row] = fleet.flagged([xid], NOW)
    assert "Xid 79, GPU has fallen off the bus, in the last 10 minutes" in row.why
    tips = advice.gpu_tips(xid, limit=3)
    assert any("79" in tip.text for tip in tips)  # the lookup tip quotes it, with what to do
    assert words.condition_text("xid_recent") == "a driver error (Xid) in the last 10 minutes"  # code unknown


# -- gpulens reclaim's notice -------------------------------------------------------------------------------


def test_the_reclaim_notice_says_what_will_happen_when_and_what_the_mode_means():
    from gpulens.dashboard.views.job import reclaim_notice
    from gpulens.fleet.records import ReclaimPending

    now = 1_000_000.0
    pending = ReclaimPending("slurm", "42", "ann", "phys", "gpu", "requeue_hold", "enforce", now + 600)
    notice = reclaim_notice([pending], "slurm", "42", now)
    assert (
        notice.startswith("gpulens reclaim will requeue and hold this job at ") and "(in 10 min, policy gpu)" in notice
    )
    assert "`gpulens reclaim keep slurm/42 --for 8h --reason TEXT`" in notice
    dry = reclaim_notice([replace(pending, mode="dry-run")], "slurm", "42", now)
    assert dry.startswith("gpulens reclaim would requeue and hold this job") and dry.endswith(
        "it runs in dry-run mode, so nothing will be done."
    )
    held = reclaim_notice([replace(pending, held=True, due_at=now - 60)], "slurm", "42", now)
    assert "(due now, policy gpu) and waits, because the verdicts of its GPUs cannot be trusted now" in held
    assert reclaim_notice([pending], "slurm", "43", now) == ""


LOST = FleetGpu(
    node="n",
    gpu="7",
    uuid="L",
    up=False,
    state="unknown",
    reason="gpu_lost",
    conditions=("lost",),
    holders=(Holder("slurm", "4242", "ann"),),
)


def test_a_lost_gpu_is_lost_on_every_page_never_unknown():
    counts = {c.name: c.count for c in fleet.state_counts([*GPUS, LOST, MIG_GPU])}
    assert counts["Lost"] == 1 and counts["Unknown"] == 0  # the MIG GPU's own unknown counts by its slices
    assert sum(counts.values()) == pytest.approx(6)
    lost_mig = replace(MIG_GPU, up=False, reason="gpu_lost", conditions=("lost",))
    assert {c.name: c.count for c in fleet.state_counts([lost_mig])}["Lost"] == 1  # lost whole, its slices too
    (square,) = fleet.node_map_rows([LOST])
    assert square["states"] == "1 lost"
    (row,) = job.gpu_rows([LOST])
    assert (row["GPU"], row["state"]) == ("n GPU 7", "Lost")
    (past,) = job.past_gpu_rows(replace(PAST, gpus=("L",)), [LOST])
    assert past["now"] == "Lost, held by slurm 4242"
    # The job's GPU-hours are counted by its GPUs' verdicts, which read unknown while a GPU is lost: said under them.
    assert job.lost_note([LOST, GPUS[2]]) == "n GPU 7 fell off the bus: its hours since count as Unknown above."
    assert job.lost_note(GPUS) == ""


def test_a_jobs_page_carries_the_message_to_send_its_owner_as_the_gpu_page_writes_it():
    idle = GPUS[1]
    about, message = job.owner_message([idle], GPUS, NOW, "https://g.example.org/job", {})
    assert about == "About GPU 1 on node-a."
    assert message == oncall.flagged(idle, NOW, "https://g.example.org/job", {}, GPUS)[0].message
    assert "Job page: https://g.example.org/job?kind=kubernetes&id=job-bob" in message.splitlines()
    second = replace(idle, gpu="2", uuid="GPU-a2", wasted_seconds=60)
    about, message = job.owner_message([second, idle], GPUS, NOW, None, {})
    assert about.startswith("About GPU 1 on node-a, the first of its 2 flagged GPUs")  # the most wasted first
    assert job.owner_message([GPUS[0]], GPUS, NOW, None, {}) == ("", "")  # busy: nothing to tell


def test_a_links_unknown_kind_is_named_with_the_kinds_there_are():
    said = job.unknown_kind("bogus")
    assert "kind 'bogus' is not a kind of job: it is one of slurm, kubernetes, docker, process" in said
    assert job.unknown_kind("slurm") == job.unknown_kind("") == ""
    assert len(job.unknown_kind("x" * 5000)) < 300 and "\\`" in job.unknown_kind("`" * 50)  # cut, and escaped


def test_a_long_value_from_a_link_is_echoed_cut_and_escaped():
    node = "n*" * 2500
    said = gpu.unknown_link(node, "1", ["node-a"], [])
    assert said is not None and len(said) < 500 and "n\\*n\\*" in said and "…" in said
    said = gpu.unknown_link("node-a", "9" * 3000, ["node-a"], ["0"])
    assert said is not None and len(said) < 600
    assert fleet.shown("9" * 3000) == "9" * 79 + "…" and fleet.shown("81234") == "81234"
    assert len(fleet.unmatched_text([("user", "u" * 5000)])) < 400
