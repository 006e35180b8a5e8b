"""`gpulens probe`: tables and JSON, one-line mistakes, and exit statuses that a script can act on."""

import io
import json
import sys
from types import SimpleNamespace

import pytest
import torch

from gpulens.agent.clock import ManualClock
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.simulator.run import ENV_SCENARIO
from gpulens.agent.simulator.scenario import load_scenario, parse_scenario
from gpulens.cli import main as gpulens_main
from gpulens.probes import cli
from gpulens.probes.table import Progress, human

from .helpers import plenty

TINY = ["--device", "cpu", "--matmul-size", "128", "--copy-mib", "4", "--repeats", "2"]


def probe(*argv, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(list(argv), stdout=out, stderr=err, **kwargs)
    return status, out.getvalue(), err.getvalue()


def test_cpu_run_prints_a_table_with_the_conventions_and_exits_0():
    status, out, err = probe(*TINY, memory=plenty)
    assert status == cli.EXIT_OK and err == ""
    assert out.startswith("GPU cpu  CPU (")
    assert "matmul fp32" in out and "pinned host memory needs CUDA" in out
    assert "Device copies count bytes read plus bytes written" in out


def test_json_carries_every_result_in_base_units():
    status, out, _ = probe(*TINY, "--json", memory=plenty)
    data = json.loads(out)
    assert status == 0 and data["min_peak_ratio"] == 0.5
    (report,) = data["reports"]
    results = {r["name"]: r for r in report["results"]}
    assert results["d2d"]["unit"] == "bytes/s" and results["d2d"]["value"] > 0
    assert results["matmul_bf16"]["unit"] == "FLOP/s" and results["matmul_bf16"]["size"] == 128


def test_a_wrong_matmul_exits_3_and_says_which():
    status, out, _ = probe(*TINY, memory=plenty, multiply=lambda a, b: torch.matmul(b, a))
    assert status == cli.EXIT_WRONG == 3
    assert "wrong" in out and "against float64" in out


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "3  a result is WRONG" in text and "1  a judged result" in text and "--min-peak-ratio" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--min-peak-ratio", "2"], "--min-peak-ratio must be between 0 and 1"),
        (["--time-budget", "soon"], "--time-budget: 'soon' is not a duration"),
        (["--memory-fraction", "0"], "--memory-fraction must be above 0"),
        (["--simulate", "probes", "--device", "cpu"], "--simulate and --device cpu exclude each other"),
        (["--simulate", "nosuch"], "scenario 'nosuch': no such file"),
        (["--simulate", "probes", "--gpu", "9"], "--gpu 9: no such GPU; indexes here: 0, 1, 2, 3, 4, 5, 6, 7"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--device", "cpu", "--gpu", "0"], "--gpu chooses GPUs; drop it with --device cpu"),
        (["--simulate", "demo", "--gpu", " , "], "--gpu names no GPU; give indexes or UUIDs, e.g. --gpu 0,1"),
        (["--simulate-time", "5"], "--simulate-time applies to --simulate"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(argv, message):
    status, out, err = probe(*argv)
    assert status == cli.EXIT_USAGE and out == ""
    assert err.startswith("gpulens probe: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "gpu, expected",
    [
        ("0", cli.EXIT_OK),
        ("3", cli.EXIT_SLOW),
        ("4", cli.EXIT_WRONG),
        ("5", cli.EXIT_UNPROBED),
        ("7", cli.EXIT_UNPROBED),
        ("0,3,4,5", cli.EXIT_WRONG),
        ("0,3,7", cli.EXIT_SLOW),
    ],
)
def test_exit_status_on_a_simulated_node(gpu, expected):
    assert probe("--simulate", "probes", "--gpu", gpu)[0] == expected


def test_each_simulated_gpu_is_probed_from_the_same_time_whatever_the_order():
    def reports(*argv):
        return {r["gpu"]: r for r in json.loads(probe("--simulate", "probes", "--json", *argv)[1])["reports"]}

    every = reports()
    # docs/scenarios.md: gpu5's job starts 3 s into a probe begun at 0 s, which stops it; gpu7 is never probed.
    assert {gpu: r["status"] for gpu, r in every.items()} == {
        **dict.fromkeys("0126", "ok"),
        **{"3": "slow", "4": "wrong", "5": "aborted", "7": "busy"},
    }
    assert every["5"]["seconds"] == 3.0 and {r["started"] for r in every.values()} == {every["0"]["started"]}
    assert reports("--gpu", "5,0") == reports("--gpu", "0,5") == {gpu: every[gpu] for gpu in "05"}
    # A busy GPU between two free ones: the one after it was probed with a handle of a library shut down, and
    # read busy ("NVML cannot list the processes ... Invalid Argument").
    assert reports("--gpu", "0,7,6") == {gpu: every[gpu] for gpu in "076"}


def test_a_threshold_of_zero_judges_nothing_slow():
    assert probe("--simulate", "probes", "--gpu", "3", "--min-peak-ratio", "0")[0] == cli.EXIT_OK


def test_a_gpu_can_be_chosen_by_uuid():
    uuid = load_scenario("probes").gpus[2].uuid
    status, out, _ = probe("--simulate", "probes", "--gpu", uuid, "--json")
    assert status == 0 and [r["uuid"] for r in json.loads(out)["reports"]] == [uuid]


def test_no_driver_exits_4_and_points_to_the_cpu():
    library = load_simulated_library(load_scenario("nvml-down"), ManualClock())
    status, out, err = probe(library=library)
    assert status == cli.EXIT_UNPROBED and out == ""
    assert "no NVIDIA driver answers here" in err and "--device cpu" in err


TWO = 'name: two\ndescription: two GPUs\ngpus:\n  - {model: "%s"%s}\n  - {model: "%s"}\n'
H100 = TWO % ("NVIDIA H100 80GB HBM3", "", "NVIDIA H100 80GB HBM3")


def node_file(tmp_path, text: str) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["--simulate", "nvml-down"],
        ["--simulate", "nvml-down", "--json"],
        ["--simulate", "faults", "--simulate-time", "205"],  # an init that fails during a driver upgrade
    ],
)
def test_a_simulated_node_whose_driver_does_not_answer_exits_4_in_one_line(argv):
    status, out, err = probe(*argv)
    assert status == cli.EXIT_UNPROBED and out == ""
    assert err.startswith("gpulens probe: no NVIDIA driver answers here (nvmlInit: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("fault", "statuses", "detail"),
    [
        # Lost: its handle is refused (dcgm-exporter issue #604); the other GPU is still probed.
        ("{kind: lost, gpu: 1}", [("0", "ok"), ("1", "error")], "not probed: NVML cannot read this GPU ("),
        ("{kind: lost, gpu: 0}", [("0", "error"), ("1", "ok")], "nvmlDeviceGetHandleByIndex: Unknown Error"),
        # An error for the process list: NVML cannot tell that the GPU is free, so the GPU is busy.
        (
            "{kind: answer, gpu: 0, function: nvmlDeviceGetComputeRunningProcesses_v3, error: unknown}",
            [("0", "busy"), ("1", "ok")],
            "NVML cannot list the processes on GPU 0 (nvmlDeviceGetComputeRunningProcesses_v3: Unknown Error)",
        ),
    ],
)
def test_a_gpu_nvml_cannot_read_is_not_probed_and_never_takes_the_others_down(tmp_path, fault, statuses, detail):
    status, out, err = probe("--simulate", node_file(tmp_path, f"{H100}faults: [{fault}]\n"), "--json")
    reports = json.loads(out)["reports"]
    assert status == cli.EXIT_UNPROBED and err == ""
    assert [(r["gpu"], r["status"]) for r in reports] == statuses
    assert any(detail in r["detail"] for r in reports)


def test_a_lost_gpu_not_chosen_is_not_read(tmp_path):
    status, out, _ = probe("--simulate", node_file(tmp_path, f"{H100}faults: [{{kind: lost, gpu: 1}}]\n"), "--gpu", "0")
    assert status == cli.EXIT_OK and "GPU 1" not in out


def test_an_absent_gpu_is_not_listed_and_the_next_one_takes_its_index(tmp_path):
    text = f"{H100}faults: [{{kind: absent, gpu: 0}}]\n"
    status, out, _ = probe("--simulate", node_file(tmp_path, text), "--json")
    (report,) = json.loads(out)["reports"]
    assert status == cli.EXIT_OK and report["gpu"] == "0"
    assert report["uuid"] == parse_scenario(text, "node.yaml").gpus[1].uuid  # NVML's index 0 is now that GPU


def test_a_mig_enabled_gpu_is_not_probed_on_a_simulated_node_as_on_a_real_one(tmp_path):
    text = TWO % ("NVIDIA A100-SXM4-80GB", ", mig: true", "NVIDIA A100-SXM4-80GB")
    status, out, _ = probe("--simulate", node_file(tmp_path, text), "--json")
    mig, whole = json.loads(out)["reports"]
    assert status == cli.EXIT_UNPROBED and (whole["gpu"], whole["status"]) == ("1", "ok")
    assert (mig["status"], mig["spec"], mig["results"]) == ("error", "A100 SXM4 80GB", [])
    assert mig["detail"] == "MIG is enabled: probes measure whole GPUs; run them with MIG off"


@pytest.fixture
def cuda_sees(monkeypatch):
    """Make torch a CUDA build that sees the GPUs of the given UUIDs (none: CUDA sees no GPU), outside `gpulens sim`."""

    def sees(*uuids):
        monkeypatch.delenv(ENV_SCENARIO, raising=False)
        monkeypatch.setattr(torch.version, "cuda", "12.6")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(uuids))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(uuids))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=uuids[i]))

    return sees


def test_a_gpu_not_probed_shows_a_dash_for_its_device(tmp_path):
    text = TWO % ("NVIDIA A100-SXM4-80GB", ", mig: true", "NVIDIA H100 80GB HBM3") + "faults: [{kind: lost, gpu: 1}]\n"
    _, out, _ = probe("--simulate", node_file(tmp_path, text))
    assert [line for line in out.splitlines() if line.startswith("GPU")] == [
        "GPU 0  NVIDIA A100-SXM4-80GB (A100 SXM4 80GB)  -  error  0.0 s  MIG is enabled: probes measure whole GPUs; "
        "run them with MIG off",
        "GPU 1  -  error  0.0 s  not probed: NVML cannot read this GPU (nvmlDeviceGetHandleByIndex: Unknown Error); "
        "check 'nvidia-smi'",
    ]


def test_a_lost_gpu_on_a_real_node_leaves_the_others_to_be_probed(cuda_sees):
    cuda_sees("GPU-elsewhere")
    library = load_simulated_library(parse_scenario(f"{H100}faults: [{{kind: lost, gpu: 1}}]\n", "x"), ManualClock())
    status, out, err = probe("--json", library=library)
    reports = json.loads(out)["reports"]
    assert status == cli.EXIT_UNPROBED and err == ""
    assert [(r["gpu"], r["status"]) for r in reports] == [("0", "error"), ("1", "error")]
    assert "CUDA does not see this GPU" in reports[0]["detail"]  # the one left to probe, hidden from CUDA here
    assert "NVML cannot read this GPU" in reports[1]["detail"]


def test_gpus_that_cuda_cannot_see_are_reported_not_probed(cuda_sees):
    cuda_sees("GPU-elsewhere")  # CUDA_VISIBLE_DEVICES names another GPU
    library = load_simulated_library(load_scenario("probes"), ManualClock())
    status, out, _ = probe("--json", "--gpu", "0,1", library=library)
    reports = json.loads(out)["reports"]
    assert status == cli.EXIT_UNPROBED and [r["gpu"] for r in reports] == ["0", "1"]
    assert all(r["status"] == "error" and "CUDA does not see this GPU" in r["detail"] for r in reports)


@pytest.mark.parametrize(
    ("cuda", "sim", "says"),
    [
        (
            None,
            None,
            "torch 2.4.0+cpu is built without CUDA; install a CUDA build (https://pytorch.org/get-started/locally/, "
            "e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126), or on a machine without "
            "GPUs run 'gpulens probe --simulate SCENARIO'",
        ),
        (
            "12.6",
            None,
            "CUDA 12.6 (torch 2.4.0+cpu) sees no GPU though NVML lists them; check CUDA_VISIBLE_DEVICES and that "
            "the driver supports CUDA 12.6 ('nvidia-smi' shows the newest it does)",
        ),
        (
            "12.6",
            "probes",  # as under `gpulens sim probes -- gpulens probe`
            "the GPUs are simulated ('gpulens sim' simulates NVML, not CUDA); 'gpulens probe --simulate probes' "
            "probes the simulated node instead",
        ),
    ],
)
def test_without_a_usable_cuda_the_probe_says_so_once_and_how_to_fix_it(monkeypatch, cuda, sim, says):
    monkeypatch.setattr(torch, "__version__", "2.4.0+cpu")
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    if sim:
        monkeypatch.setenv(ENV_SCENARIO, sim)
    else:
        monkeypatch.delenv(ENV_SCENARIO, raising=False)
    library = load_simulated_library(load_scenario("probes"), ManualClock())  # gpu7 is busy: no report either
    assert probe(library=library) == (cli.EXIT_UNPROBED, "", f"gpulens probe: {says}\n")


def test_the_gpulens_command_dispatches_probe(capsys):
    assert gpulens_main(["probe", "--simulate", "probes", "--gpu", "0"]) == 0
    assert "H100 SXM" in capsys.readouterr().out


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_draws_on_a_terminal_only():
    quiet, terminal = io.StringIO(), Terminal()
    for stream in (quiet, terminal):
        bar = Progress(stream, width=10)
        bar.update("gpu 0", 5, 10, "matmul_bf16")
        bar.close()
    assert quiet.getvalue() == ""
    assert "[#####-----] gpu 0 5/10 matmul_bf16" in terminal.getvalue()


def test_units_read_like_a_datasheet():
    assert human(3.35e12, "bytes/s") == "3.35 TB/s"
    assert human(989.5e12, "FLOP/s") == "990 TFLOP/s"
    assert human(None, "bytes/s") == "-"


def test_without_torch_the_probe_says_how_to_install_it(monkeypatch):

    import gpulens.probes

    monkeypatch.setitem(sys.modules, "gpulens.probes.runner", None)  # as if torch could not be imported
    monkeypatch.delattr(gpulens.probes, "runner", raising=False)
    status, out, err = probe(*TINY)
    assert status == cli.EXIT_UNPROBED and out == ""
    assert "the probes need torch" in err and "pip install 'gpulens[probes]'" in err


def test_a_slow_result_just_under_the_threshold_is_not_written_as_the_threshold():
    from gpulens.probes.results import SLOW, GpuReport, ProbeResult, judge
    from gpulens.probes.table import render

    measured = ProbeResult("bandwidth", "d2d", "d2d", "device", "", 1.984e12, "bytes/s", 4e12, 0.496, "ok", True)
    slow = judge(measured, 0.5)
    assert slow.status == SLOW
    report = GpuReport("0", "GPU-1", "NVIDIA H100", "H100 SXM", "cuda:0", SLOW, "", 0.0, 1.0, (slow,))
    row = next(line for line in render([report], 0.5).splitlines() if line.lstrip().startswith("d2d"))
    assert row.split()[-5:] == ["49%", "slow", "below", "the", "threshold"]


def test_on_the_cpu_a_host_copy_s_two_sides_fit_under_the_memory_cap_together():
    """Both sides of a host copy are host memory on the CPU: 1 GiB copies under a 460 MiB cap held about 790 MiB,
    and the report said 384."""
    free = 512 * 2**20
    status, out, _ = probe(
        "--device", "cpu", "--copy-mib", "64", "--matmul-size", "128", "--repeats", "2", "--memory-fraction", "0.25",
        "--json", memory=lambda device: (free, free),
    )  # fmt: skip
    (report,) = json.loads(out)["reports"]
    host_copy = next(r["size"] for r in report["results"] if r["name"] == "h2d_pageable")
    both_sides = 2 * 3 * host_copy  # three rotated buffers on each side
    assert status == cli.EXIT_OK and both_sides <= report["memory_bytes"] <= 0.25 * free
