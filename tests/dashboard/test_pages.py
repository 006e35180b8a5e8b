"""Every page, run by Streamlit's AppTest against a fake source: what it shows, and that nothing raises."""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from gpulens import words
from gpulens.dashboard.context import SOURCE_KEY
from gpulens.fleet.agents import AgentsSource
from gpulens.fleet.records import Alerts, ReclaimPending, SilenceShown, SourceProblem
from tests.dashboard.conftest import served
from tests.dashboard.fakes import ALERTS, GPUS, MIG_GPU, NOW, PROBES, FakeSource

# The pages read the clock, the fakes are dated from their import: see fakes_clock.
pytestmark = pytest.mark.usefixtures("fakes_clock")

PAGES = pathlib.Path(__file__).resolve().parents[2] / "dashboard" / "screens"
DOWN = SourceProblem("agent node-c at http://10.0.0.3:10906", "is down or unreachable; its GPUs are not shown")


def run(page: str, source, **query) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{page}.py"), default_timeout=30)
    at.session_state[SOURCE_KEY] = source
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def text(at: AppTest) -> str:
    """Everything the page wrote as text (markdown, captions, alerts, titles)."""
    parts = [
        e.value
        for kind in ("title", "subheader", "markdown", "caption", "warning", "error", "info", "success")
        for e in getattr(at, kind)
    ]
    return "\n".join(str(p) for p in parts)


def query_params(at: AppTest) -> dict[str, str]:
    """The page's query parameters, one value each: older Streamlit releases (1.51 among them) give AppTest lists."""
    return {key: value[-1] if isinstance(value, list) else value for key, value in at.query_params.items()}


def charts(at: AppTest) -> int:
    # Older Streamlit releases (1.51 among them) name the element arrow_vega_lite_chart.
    return len(at.get("vega_lite_chart")) + len(at.get("arrow_vega_lite_chart"))


def timeline_rows(at: AppTest) -> list[str]:
    """The rows of the page's state timeline (the chart of bars), top to bottom."""
    specs = [json.loads(e.proto.spec) for e in (*at.get("vega_lite_chart"), *at.get("arrow_vega_lite_chart"))]
    (timeline,) = [spec for spec in specs if spec["mark"]["type"] == "bar"]
    return timeline["encoding"]["y"]["sort"]


def test_fleet_counts_states_draws_the_map_and_lists_flagged_gpus_most_wasted_first():
    at = run("fleet", FakeSource())
    counts = {m.label: m.value for m in at.metric}
    assert counts == {
        "Idle (held, no work)": "1",
        "Starved for data": "1",
        "Underused": "0",
        "Busy": "1",
        "Free": "1",
        "Unknown": "0",
        "Lost": "0",
    }
    assert charts(at) == 1  # the node-by-GPU map
    page = text(at)
    assert "Flagged GPUs (3)" in page
    # Most GPU-hours wasted first: node-a GPU 1 (1.5 h idle), node-b GPU 0 (0.5 h starved), then the hot free GPU.
    assert page.index("node-a · GPU 1") < page.index("node-b · GPU 0") < page.index("node-b · GPU 1")
    assert "Tip: Give the idle GPU back." in page
    assert "Tip: Add DataLoader workers." in page
    assert "job waits for data 72% of each step" in page
    assert "owner: bob / research" in page
    assert "for 1 h 30 min" in page
    assert "slowed down by heat" in page
    assert not at.warning  # no problem, no banner


def test_the_fleet_page_counts_a_lost_gpu_as_lost_and_one_gpu_in_the_singular():
    lost = replace(GPUS[3], up=False, state="unknown", reason="gpu_lost", conditions=("lost",))
    at = run("fleet", FakeSource(gpus=(*GPUS[:3], lost)))
    counts = {m.label: m.value for m in at.metric}
    assert (counts["Lost"], counts["Unknown"]) == ("1", "0")
    at = run("fleet", FakeSource(), user="carol")
    assert "1 GPU by state" in [s.value for s in at.subheader]


def test_a_page_says_when_it_was_updated_in_utc():
    at = run("fleet", FakeSource())
    assert any(re.fullmatch(r"Updated \d\d:\d\d:\d\d UTC\.", c.value) for c in at.caption)


def test_fleet_flags_wasted_mig_slices_by_name_with_their_tip_and_counts_them_by_share():
    at = run("fleet", FakeSource(gpus=(*GPUS, MIG_GPU)))
    counts = {m.label: m.value for m in at.metric}
    assert (counts["Idle (held, no work)"], counts["Underused"], counts["Unknown"]) == ("1.29", "0.14", "0")
    page = text(at)
    assert "5 GPUs by state" in page and "Flagged GPUs (5)" in page
    # 1.5 + 0.5 GPU-hours of the whole GPUs, 2 h of 2/7 and 1 h of 1/7 of a GPU from the slices.
    assert "**2.71 GPU-h wasted**" in page
    entry = page[page.index("node-c · GPU 2 · 2g.20gb slice") :]
    assert page.index("node-a · GPU 1") < page.index("node-c · GPU 2 · 2g.20gb slice") < page.index("node-b · GPU 0")
    assert entry.startswith("node-c · GPU 2 · 2g.20gb slice](gpu?node=node-c&gpu=2)")
    assert "0.57 GPU-h wasted" in entry and "owner: eli / notebooks" in entry
    assert "Tip: Give the idle GPU back." in entry and "no work for 2 h" in entry  # its evidence, read by detail()
    assert "node-c · GPU 2 · 1g.10gb slice" in page
    assert charts(at) == 1


def test_the_fleet_page_over_a_simulated_mig_node(mig_agent):
    with served(mig_agent) as url:
        at = run("fleet", AgentsSource({"mig": url}))
    page = text(at)
    assert "3 GPUs by state" in page
    entry = page[page.index("mig · GPU 2 · 2g.20gb slice") :]
    assert "Idle (held, no work)" in entry and "owner: eli / notebooks" in entry
    assert "Tip: Give the idle GPU back." in entry
    assert "mig · GPU 2 · 1g.10gb slice" in page  # the underused one
    assert "GPU 1 · 3g.40gb slice" not in page  # an A100's held slices are unknown, not wasted
    assert not at.warning


def test_the_gpu_page_lists_a_mig_gpus_slices(mig_agent):
    with served(mig_agent) as url:
        at = run("gpu", AgentsSource({"mig": url}), node="mig", gpu="1")
    page = text(at)
    assert "GPU 1 on mig: MIG, 4 slices: 1 free, 3 unknown" in page and "split into MIG slices" in page
    assert "Its MIG slices (4)" in page and "Tip: Read each MIG slice's verdict." in page
    slices = at.dataframe[1].value
    assert list(slices["slice"]) == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert list(slices["share of the GPU"]) == ["43%", "29%", "14%", "14%"]
    assert list(slices["owner"]) == ["ana / vision", "bo / notebooks", "chen", ""]
    assert list(slices["state"])[-1] == "Free" and slices["why"][0] == words.reason_text("mig_no_activity")
    assert (
        slices["memory used"][0] == "30 GiB of 39.2 GiB"
        and slices["tip"][0] == "Watch a MIG slice's activity from the job or with DCGM"
    )
    assert "held one by one" in page
    # Its history, a timeline row per slice; nothing tells how busy an A100's slices are, and the page says why.
    assert [row.split(" (")[0] for row in timeline_rows(at)] == [
        "GPU 1 · 3g.40gb slice",
        "GPU 1 · 2g.20gb slice",
        "GPU 1 · 1g.10gb slice",
        "GPU 1 · 1g.10gb slice",
    ]
    assert "GPU 1's own state is unknown: in MIG mode its slices are judged one by one" in page
    assert "No samples in this range." not in page and "NVML gives no utilization in MIG mode" in page


def test_the_gpu_page_of_a_hopper_mig_gpu_draws_its_slices_history(mig_agent):
    with served(mig_agent) as url:
        at = run("gpu", AgentsSource({"mig": url}), node="mig", gpu="2")
    page = text(at)
    rows = timeline_rows(at)
    assert [row.split(" (")[0] for row in rows] == [
        "GPU 2 · 3g.40gb slice",
        "GPU 2 · 2g.20gb slice",
        "GPU 2 · 1g.10gb slice",
        "GPU 2 · 1g.10gb slice",
    ]
    assert rows[2] != rows[3] and rows[2].endswith(")")  # the two 1g.10gb told apart
    assert "GPU 2's own state is unknown" in page and "No samples in this range." not in page
    assert charts(at) == 6 and not at.warning


def test_the_gpu_page_of_a_fake_mig_gpu_draws_a_row_per_slice():
    at = run("gpu", FakeSource(gpus=(*GPUS, MIG_GPU)), node="node-c", gpu="2")
    assert timeline_rows(at) == [
        "GPU 2 · 3g.40gb slice",
        "GPU 2 · 2g.20gb slice",
        "GPU 2 · 1g.10gb slice (MIG-c2-3)",
        "GPU 2 · 1g.10gb slice (MIG-c2-4)",
    ]
    page = text(at)
    assert "each on a row of its own" in page and "No samples in this range." not in page
    assert charts(at) == 6  # the timeline and the five charts, the first with the slices' activity
    # A GPU out of MIG mode: one row, its own, and no word of slices.
    at = run("gpu", FakeSource(), node="node-a", gpu="1")
    assert timeline_rows(at) == ["GPU 1"] and "own state is unknown" not in text(at)


def test_the_gpu_page_of_a_fake_mig_gpu_lists_memory_from_the_detail():
    at = run("gpu", FakeSource(gpus=(*GPUS, MIG_GPU)), node="node-c", gpu="2")
    slices = at.dataframe[1].value
    assert list(slices["memory used"])[:3] == ["28 GiB of 40 GiB", "5 GiB of 20 GiB", "4 GiB of 10 GiB"]
    assert list(slices["tip"])[1] == "Give the idle GPU back"


def test_fleet_reads_evidence_only_for_the_gpus_it_writes_out():
    source = FakeSource()
    run("fleet", source)
    assert source.asked == ["fleet", "detail"]


def test_a_large_fleet_is_mapped_by_node_and_a_node_filter_brings_its_gpus_back():
    gpus = tuple(replace(g, node=f"node-{i:04d}", uuid=f"{g.uuid}-{i}") for i in range(600) for g in GPUS)
    at = run("fleet", FakeSource(gpus=gpus))
    page = text(at)
    assert "Every node, by the share of its GPUs flagged" in page and "2,400 GPUs are too many" in page
    assert "Flagged GPUs (1,800)" in page and "1,780 more flagged GPUs; the 1,000 most wasted" in page
    assert len(at.dataframe[0].value) == 5  # a line each for the first flagged, above the map
    assert len(at.dataframe[-1].value) == 1000
    at.multiselect(key="node").select("node-0007").run()
    assert not at.exception
    assert "Every GPU, by node" in text(at) and "Flagged GPUs (3)" in text(at)


def test_fleet_filters_narrow_every_panel():
    at = run("fleet", FakeSource())
    at.multiselect(key="user").select("carol").run()
    assert not at.exception
    counts = {m.label: m.value for m in at.metric}
    assert counts["Starved for data"] == "1" and counts["Idle (held, no work)"] == "0"
    assert "Flagged GPUs (1)" in text(at)


def test_fleet_shows_one_banner_for_every_problem_and_still_shows_the_gpus():
    problems = (DOWN, SourceProblem("node node-b", "no verdict for 2 GPU(s)"))
    at = run("fleet", FakeSource(problems=problems))
    assert len(at.warning) == 1
    banner = at.warning[0].value
    assert "node-c" in banner and "is down" in banner and "no verdict" in banner
    assert "Flagged GPUs (3)" in text(at)


def test_fleet_with_nothing_readable_says_so_in_words():
    at = run(
        "fleet", FakeSource(gpus=(), problems=(SourceProblem("Prometheus at http://p:9090", "cannot be reached"),))
    )
    assert "cannot be reached" in at.warning[0].value
    assert "No GPUs to show yet" in at.info[0].value


def test_a_source_that_raises_costs_the_panel_never_a_traceback():
    at = run("fleet", FakeSource(fail=True))
    assert "failed unexpectedly" in at.warning[0].value


@pytest.mark.parametrize("page", ["gpu", "job", "probes", "alerts"])
def test_every_page_survives_a_source_that_raises(page):
    at = run(page, FakeSource(fail=True))
    assert any("failed unexpectedly" in w.value for w in at.warning)


def test_gpu_page_opens_on_the_linked_gpu_with_charts_timeline_and_holder():
    source = FakeSource()
    at = run("gpu", source, node="node-a", gpu="1")
    page = text(at)
    assert "GPU 1 on node-a: Idle (held, no work)" in page
    assert "Tip: Give the idle GPU back." in page
    # The state timeline and the five charts (work, memory, power, temperature, PCIe: no samples for PCIe).
    assert charts(at) == 5
    assert "Is the GPU working?" in page and "Temperature" in page
    assert "No samples in this range." in page  # the fake GPU reports no PCIe traffic
    assert "Not reported here: compute units busy (SM activity)" in page
    assert len(at.dataframe) == 2  # the node's GPUs, who holds this one
    assert "gpu_history" in source.asked
    # The fake's history is 10 minutes of the hour asked: the time it begins, not a duration a step short.
    assert f"State since {words.when(NOW - 600)}** (the history this source has so far)" in page


def test_gpu_page_without_a_link_starts_on_the_first_node():
    at = run("gpu", FakeSource())
    assert "Node node-a" in text(at)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"node": "node-x", "gpu": "1"}, "Node node-x reports no GPU to this dashboard now"),
        ({"node": "node-a", "gpu": "9"}, "Node node-a lists no GPU 9 now (its GPUs: 0, 1): the link is mistyped"),
    ],
)
def test_a_link_to_a_node_or_gpu_the_source_lacks_says_so_and_shows_no_other_gpu(query, said):
    at = run("gpu", FakeSource(), **query)
    assert len(at.warning) == 1 and said in at.warning[0].value
    page = text(at)
    assert "GPU 0 on" not in page and "GPU 1 on" not in page and charts(at) == 0
    assert query_params(at) == query  # the link stays as it came


def test_gpu_page_with_problems_shows_the_banner_and_the_charts():
    at = run("gpu", FakeSource(problems=(DOWN,)), node="node-a", gpu="1")
    assert len(at.warning) == 1 and "node-c" in at.warning[0].value
    assert charts(at) == 5


def test_job_page_shows_gpus_state_breakdown_data_wait_memory_tips_and_report():
    at = run("job", FakeSource(), kind="slurm", id="81234")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["GPUs held now"] == "1"
    assert metrics["Waits for data"] == "72%"
    assert metrics["Device memory in use"] == "30 GiB"
    page = text(at)
    assert "slurm job 81234" in page and "Owner: user **carol**" in page  # whose, in its first lines
    assert "PyTorch holds 22 GiB in tensors and has reserved 28 GiB" in page
    assert "Tip: Add DataLoader workers." in page
    assert "[The job's report](report?kind=slurm&id=81234)" in page
    assert "gpulens report job 81234" in page and "--format html" in page  # the same from a shell
    assert charts(at) == 1
    # The message to send its owner, as the GPU page's on-call panel writes it about its starved GPU.
    (message,) = (c.value for c in at.code if c.value.startswith("GPU "))  # the others are its traces
    assert message.startswith("GPU 0 on node-b (NVIDIA A100-SXM4-80GB) is starved for data")
    assert "\nWhat to do: Add DataLoader workers." in message and "job?kind=slurm&id=81234" in message
    assert "About GPU 0 on node-b." in page


def test_a_job_whose_gpus_are_used_well_has_no_message_to_send():
    at = run("job", FakeSource(), kind="kubernetes", id="job-alice")
    assert not any(c.value.startswith("GPU ") for c in at.code)
    assert "None of its GPUs is flagged: nothing to tell its owner." in text(at)


PENDING = ReclaimPending("kubernetes", "job-bob", "bob", "", "default", "cancel", "enforce", NOW + 1800)


@pytest.mark.parametrize(
    ("page", "query"), [("job", {"kind": "kubernetes", "id": "job-bob"}), ("gpu", {"node": "node-a", "gpu": "1"})]
)
def test_the_job_and_gpu_pages_say_when_reclaim_will_act_and_how_to_keep_the_job(page, query):
    at = run(page, FakeSource(reclaim_=(PENDING,)), **query)
    (notice,) = [w.value for w in at.warning]
    assert notice.startswith("gpulens reclaim will cancel this job at ")
    assert re.search(r"\(in \d+ min, policy default\)", notice), notice  # 30 min after the fakes' NOW
    assert notice.endswith(
        "unless its GPUs work again or it is kept: `gpulens reclaim keep kubernetes/job-bob --for 8h --reason TEXT`."
    )


def test_a_job_reclaim_has_nothing_pending_for_shows_no_notice():
    at = run("job", FakeSource(reclaim_=(replace(PENDING, job_id="job-other"),)), kind="kubernetes", id="job-bob")
    assert not at.warning


def test_a_pods_job_page_is_headed_by_its_pod_and_names_its_owner():
    at = run("job", FakeSource(), kind="kubernetes", id="job-bob")
    page = text(at)
    assert "kubernetes pod jupyter-bob" in page and "kubernetes job id: `job-bob`" in page
    assert "Owner: user **bob**; pod **research/jupyter-bob**; on node-a." in page
    # A link that names the pod, as the pages show it, opens the same job: its id is the pod's UID.
    for pod in ("jupyter-bob", "research/jupyter-bob"):
        assert "kubernetes job id: `job-bob`" in text(run("job", FakeSource(), kind="kubernetes", id=pod)), pod


def test_job_page_links_to_the_report_url_pattern(monkeypatch):
    monkeypatch.setenv("GPULENS_DASHBOARD_REPORT_URL", "https://reports.example.org/{job_kind}/{job_id}")
    at = run("job", FakeSource(), kind="slurm", id="81234")
    assert "[The job's report](https://reports.example.org/slurm/81234)" in text(at)


def test_the_report_page_shows_the_jobs_report_with_its_downloads():
    source = FakeSource()
    at = run("report", source, kind="slurm", id="80077")
    page = text(at)
    assert "# GPU usage of job 80077" in page and "**owner**: carol" in page
    assert "| Starved for data | 1.50 | 75% |" in page  # how its GPU-hours were spent, in the pages' words
    assert "gpulens report job 80077 --format html" in page
    assert "job_report slurm 80077" in source.asked
    downloads = {b.proto.label: b.proto for b in at.get("download_button")}
    assert set(downloads) == {
        "Download the page (HTML)",
        "Download the table (CSV)",
        "Download the data (JSON)",
    }


def test_the_report_page_of_an_unknown_job_or_none_says_so():
    at = run("report", FakeSource(), kind="slurm", id="424242")
    assert at.info[0].value.startswith(
        "This dashboard's data (a fake source) has no record of slurm job 424242 in the last 30 days."
    )
    assert not at.get("download_button")
    at = run("report", FakeSource())
    assert "No job named" in at.info[0].value
    at = run("report", FakeSource(problems=(DOWN,)), kind="slurm", id="424242")
    assert "node-c" in at.warning[0].value and not at.info  # the problem, not a claim that there is no record


def test_job_page_without_jobs_says_so():
    at = run("job", FakeSource(gpus=tuple(replace(g, holders=()) for g in GPUS), jobs_=()))
    assert "No jobs to show" in at.info[0].value


def test_a_link_to_a_job_that_is_not_running_says_so_and_shows_what_the_source_has():
    source = FakeSource()
    at = run("job", source, kind="slurm", id="80077")
    page = text(at)
    assert "slurm job 80077 is not running" in page
    assert "slurm job 81234" not in page and not at.metric  # no other job in its place
    assert query_params(at) == {"kind": "slurm", "id": "80077"}  # the link stays
    assert "No GPU this dashboard sees is held by it now" in at.info[0].value
    # The fake's records are 3 h older than NOW; fakes_clock runs the page's clock from NOW.
    assert re.search(r"\(3 h( 0\d min)? ago\)", page) and "1.50 GPU-h wasted" in page
    assert charts(at) == 1  # its GPU-hours by state
    assert list(at.dataframe[0].value["GPU"]) == ["node-b GPU 0", "GPU-gone"]
    assert "gpulens report job 80077 --format html" in page
    assert "past_job slurm 80077" in source.asked
    assert at.selectbox[0].label == "Open a running job instead" and at.selectbox[0].value is None


def test_a_link_to_a_job_the_source_never_saw_says_so_and_points_to_its_report(monkeypatch):
    monkeypatch.setenv("GPULENS_DASHBOARD_REPORT_URL", "https://reports.example.org/{job_kind}/{job_id}")
    at = run("job", FakeSource(), kind="slurm", id="424242")
    assert "slurm job 424242 is not running" in text(at)
    assert "no record of it in the last 7 days" in at.info[0].value
    # With a node not read (its agent down), the job may run there: not "not running".
    at = run("job", FakeSource(problems=(DOWN,)), kind="slurm", id="424242")
    assert "slurm job 424242 holds none of the GPUs read now" in text(at) and "is not running" not in text(at)
    assert "it may run there" in at.info[0].value and "no record of it in the last 7 days" in at.info[0].value
    assert "[The job's report](https://reports.example.org/slurm/424242)" in text(at)
    assert len(at.warning) == 1 and "node-c" in at.warning[0].value


def test_a_link_to_a_kind_of_job_there_is_not_says_which_kinds_there_are():
    source = FakeSource()
    at = run("job", source, kind="bogus", id="1")
    assert "kind 'bogus' is not a kind of job: it is one of slurm, kubernetes, docker, process" in at.warning[0].value
    assert "is not running" not in text(at) and not any(a.startswith("past_job") for a in source.asked)


def test_a_link_with_a_very_long_id_or_node_shows_it_cut():
    at = run("job", FakeSource(), kind="slurm", id="9" * 3000)
    page = text(at).replace("9" * 3000, "ID")  # whole in the report's link, which shows no id
    assert f"slurm job {'9' * 79}… is not running" in page and "9" * 100 not in page
    assert f"gpulens report job '{'9' * 79}…'" in page
    at = run("gpu", FakeSource(), node="n" * 5000, gpu="1")
    assert "n" * 100 not in at.warning[0].value and "n" * 79 + "…" in at.warning[0].value


def test_a_link_to_a_job_when_the_fleet_cannot_be_read_does_not_say_it_is_not_running():
    unreachable = SourceProblem("prometheus at http://127.0.0.1:9", "cannot be reached (connection refused)")
    at = run("job", FakeSource(gpus=(), jobs_=(), problems=(unreachable,)), kind="slurm", id="81234")
    page = text(at)
    assert "Whether slurm job 81234 runs now is not known" in page and "is not running" not in page
    assert "no record of it" not in page and "cannot be reached" in at.warning[0].value


def test_a_source_that_raises_on_a_past_job_costs_the_panel_never_a_traceback():
    at = run("job", FakeSource(fail=True), kind="slurm", id="80077")
    assert "Whether slurm job 80077 runs now is not known" in text(at)  # the fleet failed too
    assert "what the source has of job 80077 failed unexpectedly" in at.warning[0].value


def test_picking_a_running_job_instead_of_a_link_to_a_finished_one_opens_it():
    at = run("job", FakeSource(), kind="slurm", id="80077")
    at.selectbox(key="job_instead").select(("kubernetes", "job-bob")).run()
    assert not at.exception
    assert query_params(at) == {"kind": "kubernetes", "id": "job-bob"}
    assert "kubernetes pod jupyter-bob" in text(at) and "is not running" not in text(at)


def test_a_job_link_without_a_kind_opens_the_running_job_with_that_id():
    at = run("job", FakeSource(), id="81234")
    assert "slurm job 81234" in text(at)
    assert query_params(at) == {"kind": "slurm", "id": "81234"}


def test_probes_page_lists_outliers_first():
    at = run("probes", FakeSource())
    assert "node-a GPU 1" in at.error[0].value  # 2.0 TB/s against a 2.9 TB/s median
    assert len(at.dataframe) == 1


def test_a_percent_column_writes_every_row_to_the_same_tenth():
    for page in ("probes", "trends"):
        for frame in run(page, FakeSource()).dataframe:
            columns = json.loads(frame.proto.columns).values()
            percents = [c["type_config"] for c in columns if c.get("type_config", {}).get("format") == "percent"]
            assert all(c.get("step") == 0.001 for c in percents), (page, percents)


def test_probes_page_without_results_says_none_yet():
    at = run("probes", FakeSource(probes_=()))
    assert "No probe results yet" in at.info[0].value


def test_probes_page_over_a_store_that_failed_shows_the_problem_not_that_there_is_none():
    at = run("probes", FakeSource(probes_=(), problems=(DOWN,)))
    assert "node-c" in at.warning[0].value and not at.info


def test_probes_page_leaves_the_fleet_median_of_a_gpu_alone_with_its_model_empty():
    alone = replace(PROBES[0], model="NVIDIA A100-SXM4-80GB")
    table = run("probes", FakeSource(probes_=(alone, *PROBES[1:]))).dataframe[0].value
    medians = dict(zip(table["node"] + " " + table["gpu"], table["of_fleet_median"], strict=True))
    # 2.0 and 2.95 TB/s: a median of 2.475; A100 on node-a GPU 0 has no peer, where "None" showed.
    assert medians == {"node-a 1": "80.8%", "node-c 0": "119.2%", "node-a 0": ""}


def test_probes_page_leaves_the_datasheet_share_of_a_model_without_a_figure_empty():
    unknown = replace(PROBES[1], model="NVIDIA H20", peak_ratio=None)
    table = run("probes", FakeSource(probes_=(PROBES[0], unknown, PROBES[2]))).dataframe[0].value
    shares = dict(zip(table["node"] + " " + table["gpu"], table["of_spec"], strict=True))
    assert shares[f"{unknown.node} {unknown.gpu}"] == ""  # "None" showed
    assert all(share.endswith("%") for key, share in shares.items() if key != f"{unknown.node} {unknown.gpu}")


def test_alerts_page_shows_the_labels_a_job_chose_as_written():
    # A summary or description quotes a job's labels (its Slurm account, user, pod): no link, colour, emoji or
    # emphasis of their making.
    hostile = replace(
        ALERTS[0],
        summary="GPU 1 held by account [click](http://evil.example) :red[ADMIN] **boss**",
        description="pod p_*x*_ of bob:rotating_light: has run nothing for 90 minutes",
    )
    shown = run("alerts", FakeSource(alerts_=Alerts((hostile,)))).markdown[0].value
    assert "account \\[click\\](http:\u2060//evil.example) :\u2060red\\[ADMIN\\] \\*\\*boss\\*\\*" in shown
    assert "pod p\\_\\*x\\*\\_ of bob:\u2060rotating_light: has run" in shown
    assert shown.startswith("**GpulensGpuIdle** (warning, firing for 1 h) on [node-a GPU 1](gpu?node=node-a&gpu=1)")


def test_the_banner_shows_a_problem_as_written():
    query = SourceProblem("Prometheus at http://p:9090", "answered an error to 'increase(x[86400s]) by (__name__)'")
    banner = run("fleet", FakeSource(problems=(query,))).warning[0].value
    assert (
        "- **Prometheus at http:\u2060//p:9090** answered an error to 'increase(x\\[86400s\\]) by (\\_\\_name\\_\\_)'"
        in banner
    )


def test_alerts_page_links_each_alert_to_its_gpu():
    page = text(run("alerts", FakeSource()))
    assert "GpulensGpuIdle" in page and "(gpu?node=node-a&gpu=1)" in page and "[Runbook]" in page


def test_alerts_page_says_what_alertmanager_did_and_lists_the_silences():
    silenced = replace(ALERTS[0], notice="silenced", notice_why='instance="node-a" by ops: maintenance')
    inhibited = replace(
        ALERTS[0], name="GpulensGpuXidError", notice="inhibited", notice_why="GpulensGpuLost on node-a GPU 1"
    )
    alerts = Alerts(
        (silenced, inhibited),
        alertmanager="Alertmanager at http://am:9093",
        silences=(SilenceShown('instance="node-a"', "ops", "maintenance", NOW + 7200),),
    )
    at = run("alerts", FakeSource(alerts_=alerts))
    page = text(at)
    assert 'Alertmanager: silenced: instance="node-a" by ops: maintenance' in page
    assert "Alertmanager: held back (inhibited) by: GpulensGpuLost on node-a GPU 1" in page
    assert "Silences in force (1)" in page and "From Alertmanager at http://am:9093" in page
    table = at.dataframe[0].value
    assert list(table["by"]) == ["ops"] and list(table["why"]) == ["maintenance"]


def test_alerts_page_in_agent_mode_says_alerts_need_prometheus():
    at = run("alerts", FakeSource(alerts_=Alerts((), supported=False)))
    assert "Alerts need Prometheus" in at.info[0].value


def test_alerts_page_with_nothing_firing():
    assert "Nothing is firing" in run("alerts", FakeSource(alerts_=Alerts(()))).success[0].value
    at = run("alerts", FakeSource(alerts_=Alerts((), rules_loaded=False)))  # nothing can fire: no all-clear
    assert not at.success and "evaluates none of gpulens's alert rules" in at.warning[0].value


def test_app_builds_the_navigation_over_the_five_pages():
    at = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=30)
    at.session_state[SOURCE_KEY] = FakeSource()
    at.run()
    assert not at.exception
    assert at.title[0].value == "Fleet"


def test_without_a_configured_source_the_page_says_how_to_start_it(monkeypatch):
    for name in ("GPULENS_DASHBOARD_PROMETHEUS", "GPULENS_DASHBOARD_AGENTS"):
        monkeypatch.delenv(name, raising=False)
    at = AppTest.from_file(str(PAGES / "fleet.py"), default_timeout=30)
    at.run()
    assert not at.exception
    assert "gpulens dashboard --prometheus URL" in at.error[0].value


def test_the_gpu_page_names_its_holder_under_its_heading_with_the_job_link():
    at = run("gpu", FakeSource(), node="node-a", gpu="1")
    page = text(at)
    heading = page.index("GPU 1 on node-a: Idle")
    held = page.index("Held by user bob, Kubernetes pod research/jupyter-bob: [open the job's page](job?")
    assert heading < held


def test_fleet_filters_are_kept_in_the_address_and_read_back_from_it():
    at = run("fleet", FakeSource())
    at.multiselect(key="user").select("carol").run()
    assert not at.exception
    assert query_params(at)["user"] == "carol"
    linked = run("fleet", FakeSource(), user="carol")  # the same address, opened anew
    assert linked.multiselect(key="user").value == ["carol"] and "Flagged GPUs (1)" in text(linked)


def test_a_link_that_filters_on_a_value_no_gpu_has_says_so_and_keeps_the_other_filters():
    at = run("fleet", FakeSource(), node="node-gone", user="carol")
    (warning,) = [w.value for w in at.warning if "node-gone" in w.value]
    assert warning.startswith("This link filters on node 'node-gone', which no GPU here has now")
    assert at.multiselect(key="user").value == ["carol"] and "Flagged GPUs (1)" in text(at)
    assert not [w for w in run("fleet", FakeSource(), user="carol").warning if "This link" in w.value]
