"""The fleet page's PromQL, evaluated by promtool on series written for each case: what the page reads
when a verdict changes, and the time wasted across an agent restart."""

from __future__ import annotations

import subprocess

import yaml

from gpulens.fleet import prometheus
from tests.tools import require_tool

GPU = 'job="gpulens", instance="n1", gpu="0", uuid="U"'


def promtool_test(tmp_path, series: list[tuple[str, str]], checks: list[tuple[str, str, list[dict]]]) -> None:
    """Run promtool's unit test: `series` every 15 s as (series, values), `checks` as (expr, time, samples)."""
    (tmp_path / "empty.rules.yml").write_text("groups: []\n")
    test = {
        "rule_files": ["empty.rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [{"expr": e, "eval_time": t, "exp_samples": samples} for e, t, samples in checks],
            }
        ],
    }
    path = tmp_path / "fleet.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_last_minutes_verdict_fills_the_gap_between_two_verdict_series(tmp_path):
    old = f'gpulens_gpu_verdict_info{{{GPU}, state="busy", reason="healthy"}}'
    new = f'gpulens_gpu_verdict_info{{{GPU}, state="idle", reason="no_kernels"}}'
    # The busy series ends at 300 s (a staleness marker at 315 s); the idle one is searchable from 330 s.
    series = [(old, "1x20 stale"), (new, "_x22 1x4")]
    verdicts = prometheus.FLEET_QUERIES["verdicts"]
    recent = prometheus.RECENT_VERDICTS % 'instance=~"n1", uuid=~"U"'
    checks = [
        (verdicts, "320s", []),  # the gap
        (recent, "320s", [{"labels": old.replace(" ", ""), "value": 1}]),  # which the last minute fills
        (verdicts, "345s", [{"labels": new.replace(" ", ""), "value": 1}]),
    ]
    promtool_test(tmp_path, series, checks)


def test_the_time_wasted_is_read_from_the_recorded_counter_across_an_agent_restart(tmp_path):
    recorded = f"instance_gpu:gpulens_gpu_wasted_seconds_total:sum{{{GPU}}}"
    busy = 'instance_gpu:gpulens_gpu_wasted_seconds_total:sum{job="gpulens", instance="n1", gpu="1", uuid="V"}'
    # 15 s of waste every 15 s for 10 minutes; the agent restarts at 300 s and counts from 0 again.
    series = [(recorded, "0+15x19 0+15x20"), (busy, "0x40")]
    query = prometheus.WASTED_RECORDED % 600
    # 600 s of waste but the 15 s between the last count before the restart and the first after it; the
    # GPU that wasted nothing is left out.
    checks = [(query, "600s", [{"labels": f"{{{GPU}}}".replace(" ", ""), "value": 585}])]
    promtool_test(tmp_path, series, checks)


def test_a_gpus_busy_ratio_ends_when_it_falls_off_the_bus(tmp_path):
    # Busy all the time, counted every 15 s, until 300 s; then off the bus: gpulens_gpu_up 0, no counters.
    series = [
        (f"gpulens_gpu_busy_seconds_total{{{GPU}}}", "0+15x20 stale"),
        (f"gpulens_gpu_sampled_seconds_total{{{GPU}}}", "0+15x20 stale"),
        (f"gpulens_gpu_up{{{GPU}}}", "1x20 0x10"),
    ]
    query = prometheus.BUSY_RATIO % {"where": 'instance="n1", gpu="0"', "window": 60}
    # The rate over the last minute still has points at 330 s; the GPU answers nothing then.
    checks = [(query, "300s", [{"labels": f"{{{GPU}}}".replace(" ", ""), "value": 1}]), (query, "330s", [])]
    promtool_test(tmp_path, series, checks)


def test_one_query_reads_every_mig_slices_verdict_share_and_time_wasted(tmp_path):
    slice_ = 'job="gpulens", instance="n1", gpu="1", uuid="MIG-1", gpu_uuid="G", gpu_instance="2", compute_instance="0"'
    labels = f'{slice_}, mig_profile="2g.20gb"'
    verdict = f'gpulens_mig_verdict_info{{{labels}, state="idle", reason="no_kernels", tip="release_idle_gpu"}}'
    share = f"gpulens_mig_gpu_share_ratio{{{labels}}}"
    # Idle from 300 s on, 15 s at a time; the free slice wastes nothing and is left out of the time wasted.
    idle = f'gpulens_mig_state_seconds_total{{{labels}, state="idle"}}'
    free = f'gpulens_mig_state_seconds_total{{{labels.replace("MIG-1", "MIG-2")}, state="free"}}'
    series = [(verdict, "1x40"), (share, f"{2 / 7}x40"), (idle, "_x20 0+15x20"), (free, "0+15x40")]
    query = prometheus.MIG % 600
    checks = [
        (
            query,
            "600s",
            [
                {"labels": verdict.replace(", ", ","), "value": 1},
                {"labels": share.replace(", ", ","), "value": 2 / 7},
                {"labels": '{__name__="wasted_seconds",instance="n1",gpu="1",uuid="MIG-1",gpu_uuid="G"}', "value": 300},
            ],
        )
    ]
    promtool_test(tmp_path, series, checks)
