"""Scenario loading: built-ins, model defaults and one-line errors that name the place."""

import os
import re
import textwrap

import pytest

from gpulens.agent.simulator import scenario as scenario_module
from gpulens.agent.simulator.hardware import DRIVER_RESERVE
from gpulens.agent.simulator.scenario import ScenarioError, builtin_scenarios, load_scenario

from .common import started

BUILTINS = ["bench8x32", "demo", "diagnosis", "faults", "mig", "nvml-down", "old-driver", "probes", "square20"]

GOOD_GPU = 'model: "NVIDIA H100 80GB HBM3"'


def write(tmp_path, text: str, name: str = "bad.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_builtins_are_listed_and_load():
    assert builtin_scenarios() == BUILTINS
    for name in BUILTINS:
        scenario = load_scenario(name)
        assert scenario.name == name
        assert scenario.gpus
        assert "\n" not in scenario.description


def test_demo_matches_its_description():
    demo = load_scenario("demo")
    assert len(demo.gpus) == 8
    assert {g.name for g in demo.gpus} == {"NVIDIA H100 80GB HBM3"}
    pids = [p.pid for g in demo.gpus for p in g.processes]
    assert len(pids) == 8
    assert all(4000 <= pid < 5000 for pid in pids)
    assert not demo.gpus[3].processes
    assert demo.gpus[5].pcie.gen == 3 and demo.gpus[5].pcie.max_gen == 5
    assert [x.code for x in demo.gpus[7].xid] == [31]


def test_bench_has_32_processes():
    assert sum(len(g.processes) for g in load_scenario("bench8x32").gpus) == 32


def test_model_defaults_and_aliases():
    faults = load_scenario("faults")
    a100 = faults.gpus[0]
    assert a100.name == "NVIDIA A100-SXM4-80GB"  # "A100-SXM4-80GB" in the file
    assert a100.memory_total == 81920 * 2**20
    assert a100.power_limit == 400 and a100.idle_power == 40
    assert not a100.gpm and a100.mig_capable and a100.row_remapping
    h100 = load_scenario("demo").gpus[0]
    assert h100.gpm and h100.pcie.max_gen == 5 and h100.power_limit == 700
    t4 = load_scenario("old-driver").gpus[0]
    assert not t4.row_remapping and not t4.mig_capable and t4.pcie.gen == 3


def test_identity_defaults_are_derived_and_deterministic(tmp_path):
    demo = load_scenario("demo")
    uuids = [g.uuid for g in demo.gpus]
    assert len(set(uuids)) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids)
    assert uuids == [g.uuid for g in load_scenario("demo").gpus]
    assert [g.pci_bus_id for g in demo.gpus][:3] == ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0"]
    other_seed = load_scenario(
        write(
            tmp_path,
            f"""
        name: s
        description: d
        seed: 8
        gpus:
          - {GOOD_GPU}
        """,
            "s.yaml",
        )
    )
    assert other_seed.gpus[0].uuid != demo.gpus[0].uuid
    assert re.fullmatch(r"\d{13}", other_seed.gpus[0].serial)


def test_unknown_model_with_required_keys(tmp_path):
    scenario = load_scenario(
        write(
            tmp_path,
            """
        name: custom
        description: d
        start_time: 1700000000
        gpus:
          - {model: "Acme X1", memory_total: 24GiB, power_limit: 300}
        """,
            "custom.yaml",
        )
    )
    gpu = scenario.gpus[0]
    assert (gpu.name, gpu.memory_total, gpu.power_limit, gpu.idle_power) == ("Acme X1", 24 * 2**30, 300, 30)
    assert scenario.start_time == 1700000000


H100_MIG = 'model: "NVIDIA H100 80GB HBM3"\n    mig:\n      - {profile: 3g.40gb, gpu_instance: 1}'


def body(gpu_lines: str = GOOD_GPU, extra: str = "") -> str:
    return f"name: t\ndescription: d\ngpus:\n  - {gpu_lines}\n{extra}"


@pytest.mark.parametrize(
    ("text", "place", "fix"),
    [
        (body(GOOD_GPU + "\n    utilisation: 50"), "gpus[0]", "unknown key 'utilisation'; did you mean 'utilization'?"),
        (
            body(GOOD_GPU + "\n    utilization: {sqare: {high: 100}}"),
            "gpus[0].utilization",
            "unknown shape 'sqare'; use one of constant, square, ramp, steps, noise",
        ),
        (
            body(GOOD_GPU + "\n    utilization: {square: {high: 100, period: 4, duty: 1.5}}"),
            "gpus[0].utilization.square.duty",
            "duty must be between 0 and 1, got 1.5",
        ),
        (body(GOOD_GPU + "\n    utilization: 120"), "gpus[0].utilization", "values must be between 0 and 100"),
        (body(GOOD_GPU + "\n    sm_activity: 80"), "gpus[0].sm_activity", "values must be between 0 and 1"),
        (
            body(extra="faults:\n  - {kind: exploded, gpu: 0}"),
            "faults[0].kind",
            "unknown value 'exploded'; use one of lost, not_supported",
        ),
        (
            body(extra="faults:\n  - {kind: lost, gpu: 2, at: 5}"),
            "faults[0].gpu",
            "gpu 2 does not exist; this scenario has gpus 0..0",
        ),
        (
            body(extra="faults:\n  - {kind: lost, gpu: 0, at: 50, until: 40}"),
            "faults[0].until",
            "until (40) must be after at (50)",
        ),
        (
            body(extra="faults:\n  - {kind: process_vanishes, gpu: 0, pid: 9}"),
            "faults[0].pid",
            "gpu 0 has no process with pid 9",
        ),
        (  # a fault that could never happen: the process is not in the list then
            body(
                GOOD_GPU + "\n    processes: [{pid: 9, memory: 1GiB, start: 50, end: 90}]",
                "faults:\n  - {kind: process_vanishes, gpu: 0, pid: 9, at: 5}",
            ),
            "faults[0].at",
            "pid 9 does not run at 5 s (50 s to 90 s); give an at then",
        ),
        (
            body(
                H100_MIG,
                "faults:\n  - {kind: answer, gpu: 0, mig_device: 5, function: nvmlDeviceGetName, error: unknown}",
            ),
            "faults[0].mig_device",
            "gpu 0 has at most 1 MIG devices at once, indexes 0 to 0; give one of them",
        ),
        (
            body(extra="faults:\n  - {kind: function_not_found, function: nvmlDeviceGetCurrentClocksEventReason}"),
            "faults[0].function",
            "did you mean 'nvmlDeviceGetCurrentClocksEventReasons'?",
        ),
        (
            body(extra="faults:\n  - {kind: init_failure, error: driver_not_loaded, gpu: 0}"),
            "faults[0]",
            "unknown key 'gpu'",
        ),
        (
            body(GOOD_GPU + "\n    memory_total: 40GBB"),
            "gpus[0].memory_total",
            "'40GBB' is not a size; write e.g. '256MiB' or '1GiB'",
        ),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 90GiB}"),
            "gpus[0].processes[0].memory",
            "90 GiB is more than the GPU's memory_total, 79.6 GiB; use at most that",
        ),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 1GiB}\n      - {pid: 7, memory: 1GiB}"),
            "gpus[0].processes[1].pid",
            "pid 7 appears twice",
        ),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: -3, memory: 1GiB}"),
            "gpus[0].processes[0].pid",
            "must be between 1",
        ),
        (
            body(GOOD_GPU + "\n    throttle: [{reasons: [power_cap]}]"),
            "gpus[0].throttle[0].reasons[0]",
            "unknown value 'power_cap'",
        ),
        (body(GOOD_GPU + "\n    not_supported: [powr]"), "gpus[0].not_supported[0]", "did you mean 'power'?"),
        (body(GOOD_GPU + "\n    pcie: {gen: 6, max_gen: 5}"), "gpus[0].pcie.gen", "must be between 1 and 5"),
        (body('model: "Tesla T4"\n    mig: true'), "gpus[0].mig", "Tesla T4 does not support MIG"),
        (
            body('model: "NVIDIA A100-SXM4-80GB"\n    mig: true\n    processes: [{pid: 4, memory: 1GiB}]'),
            "gpus[0].processes",
            "in MIG mode a process runs in a MIG device: describe the devices as a list under mig",
        ),
        (
            body(H100_MIG + "\n    processes: [{pid: 4, memory: 1GiB}]"),
            "gpus[0].processes",
            "in MIG mode a process runs in a MIG device: move it to mig[N].processes",
        ),
        (body(H100_MIG + "\n      - profile: 2g.10gb"), "gpus[0].mig[1].profile", "choose one of 1g.10gb, "),
        (
            body(H100_MIG + "\n      - profile: 4g.40gb\n      - profile: 1g.10gb"),
            "gpus[0].mig",
            "at 0 s the instances need 8 compute and 9 memory slices",
        ),
        (
            body(H100_MIG + "\n      - {profile: 1g.10gb, processes: [{pid: 9, memory: 12GiB}]}"),
            "gpus[0].mig[1].processes[0].memory",
            "12 GiB is more than the 1g.10gb instance's memory, 9.8 GiB; use at most that",
        ),
        (
            body(H100_MIG + "\n      - {profile: 1g.10gb, until: 60, processes: [{pid: 9, memory: 1GiB}]}"),
            "gpus[0].mig[1].processes[0].end",
            "an instance in use cannot be destroyed: end by its until (60)",
        ),
        (
            body(H100_MIG + "\n      - {profile: 1g.10gb, at: 60, processes: [{pid: 9, memory: 1GiB}]}"),
            "gpus[0].mig[1].processes[0].start",
            "the instance is created at 60 s",
        ),
        (
            body(H100_MIG + "\n      - {profile: 1g.10gb, gpu_instance: 1}"),
            "gpus[0].mig[1].gpu_instance",
            "1 is taken by another instance then; give another, or leave it out for the driver to pick",
        ),
        (
            "name: t\ndescription: d\ngpus:\n" + "  - model: H100 80GB HBM3\n"
            "    mig: [{profile: 1g.10gb, uuid: MIG-11111111-2222-3333-4444-555555555555}]\n" * 2,
            "gpus[1].mig[0].uuid",
            "MIG-11111111-2222-3333-4444-555555555555 is also the uuid of gpus[0].mig[0]; give each its own",
        ),
        (
            body(H100_MIG + "\n    allocated_to: {kind: kubernetes, id: u, user: a, namespace: n, pod: p}"),
            "gpus[0].allocated_to",
            "move it to mig[N].allocated_to",
        ),
        (
            body(H100_MIG + "\n    processes: [{pid: 9, memory: 1GiB}]"),
            "gpus[0].processes",
            "move it to mig[N].processes",
        ),
        (
            body(
                'model: "NVIDIA A100-SXM4-80GB"\n    mig:\n'
                "      - {profile: 1g.10gb, processes: [{pid: 9, memory: 1GiB}]}\n"
                "      - {profile: 1g.10gb, processes: [{pid: 9, memory: 1GiB}]}"
            ),
            "gpus[0].mig[1].processes",
            "pid 9 is also used in another instance",
        ),
        (
            body('model: "Tesla T4"\n    remapped_rows: {correctable: 1}'),
            "gpus[0].remapped_rows",
            "has no row remapping",
        ),
        (body('model: "Acme X1"'), "gpus[0]", "unknown model 'Acme X1' needs memory_total"),
        # What the model cannot do: a clock above its maximum, a GDDR board's memory temperature, GPM before Hopper.
        (body('model: "H100 80GB HBM3"\n    clocks: {sm: 5000}'), "gpus[0].clocks.sm", "between 0 and 1980, got 5000"),
        (
            body('model: "H100 80GB HBM3"\n    max_clocks: {memory: 1000}\n    clocks: {memory: 2619}'),
            "gpus[0].clocks.memory",
            "between 0 and 1000, got 2619",
        ),
        (body('model: "L4"\n    memory_temperature: 50'), "gpus[0].memory_temperature", "has GDDR memory"),
        (body('model: "A100-SXM4-80GB"\n    gpm: true'), "gpus[0].gpm", "has no GPM (Hopper and newer have it)"),
        ("description: d\ngpus: []\n", "top level", "missing key 'name'"),
        (body() + "flavour: x\n", "top level", "unknown key 'flavour'"),
        (body(GOOD_GPU + '\n    uuid: "GPU-1234"'), "gpus[0].uuid", "expected GPU-xxxxxxxx"),
        (
            body(
                GOOD_GPU + '\n    pci_bus_id: "00000000:2A:00.0"\n  - model: H200\n    pci_bus_id: "00000000:2a:00.0"'
            ),
            "gpus[1].pci_bus_id",
            "00000000:2A:00.0 is also the pci_bus_id of gpus[0]; give each GPU its own",
        ),
        (
            body(GOOD_GPU + '\n    pci_bus_id: "00000000:2A:00.0"\n  - model: H200'),
            "gpus[1].pci_bus_id",
            "00000000:2A:00.0 by default is also the pci_bus_id of gpus[0]",
        ),
        # nvmlDeviceGetHandleBySerial finds one board per serial, as it does per uuid and bus id.
        (
            body(GOOD_GPU + '\n    serial: "1320221234567"\n  - model: H200\n    serial: "1320221234567"'),
            "gpus[1].serial",
            "1320221234567 is also the serial of gpus[0]; give each GPU its own",
        ),
        (
            body(
                GOOD_GPU + '\n    uuid: "GPU-00000000-0000-0000-0000-000000000001"\n  - model: H200\n'
                '    uuid: "GPU-00000000-0000-0000-0000-000000000001"'
            ),
            "gpus[1].uuid",
            "GPU-00000000-0000-0000-0000-000000000001 is also the uuid of gpus[0]; give each GPU its own",
        ),
        # YAML reads an unquoted 535.10 as the number 535.1, which names another release.
        (body() + "driver: 535.10\n", "driver", 'driver: 535.1 is a number, not a version; quote it, e.g. driver: "'),
        (body() + "driver_version: 535.10\n", "driver_version", 'quote it, e.g. driver_version: "535.104.05"'),
        (body() + "driver: 535\n", "driver", "a number, not a version; write the branch r535 or quote a release"),
        (body() + "nvml_version: 12.550\n", "nvml_version", 'quote it, e.g. nvml_version: "12.550.163.01"'),
        (body() + "driver: true\n", "driver", "expected a non-empty string, got true"),
        # A size below zero is negative, not a unit that does not read.
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: -1GiB}"),
            "gpus[0].processes[0].memory",
            "'-1GiB' must not be negative; write e.g. '256MiB' or '1GiB'",
        ),
        (body(GOOD_GPU + "\n    memory_total: -1GiB"), "gpus[0].memory_total", "'-1GiB' must not be negative"),
        # NVML gives a name as a C string, cut at a NUL; tools print it to a terminal, where an escape acts.
        (
            body('model: "X\\u0000Y"\n    memory_total: 10GiB\n    power_limit: 300'),
            "gpus[0].model",
            "holds characters that are not printable; write plain text",
        ),
        (
            'name: "a\\u001b[31mb"\ndescription: d\ngpus:\n  - ' + GOOD_GPU + "\n",
            "name",
            "'a\\x1b[31mb' holds characters that are not printable",
        ),
        (body(GOOD_GPU + "\n    pcie: {tx: -2GB/s}"), "gpus[0].pcie.tx", "'-2GB/s' must not be negative"),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: -5}"),
            "gpus[0].processes[0].memory",
            "must not be negative, got -5",
        ),
        (
            body(GOOD_GPU + "\n    memory_used: {constant: 1GiB, min: -5}"),
            "gpus[0].memory_used.min",
            "must not be negative",
        ),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 1GiB, torch: {data_wait: 0, allocated: -1}}"),
            "gpus[0].processes[0].torch.allocated",
            "must not be negative, got -1",
        ),
        (
            body(GOOD_GPU + "\n    utilization: {ramp: {from: -5, to: 50, duration: 9}}"),
            "gpus[0].utilization",
            "values must not be negative, got -5",
        ),
        # Sizes and rates in messages read as people write them, not 1.50755e+11.
        (
            body("model: H200\n    memory_used: 160GiB"),
            "gpus[0].memory_used",
            "values must be between 0 GiB and 140.4 GiB, got 160 GiB",
        ),
        (
            body("model: H200\n    memory_used: {constant: 100GiB, noise: 200GiB}"),
            "gpus[0].memory_used",
            "noise must be at most 140.4 GiB, the whole range, got 200 GiB",
        ),
        (
            body("model: H200\n    memory_used: {constant: 10GiB, min: 50GiB, max: 10GiB}"),
            "gpus[0].memory_used",
            "min 50 GiB is above max 10 GiB",
        ),
        (
            body("model: H200\n    processes:\n      - {pid: 7, memory: 200GiB}"),
            "gpus[0].processes[0].memory",
            "200 GiB is more than the GPU's memory_total, 140.4 GiB; use at most that",
        ),
        # Where the two would read alike in GiB, the exact bytes tell them apart.
        (
            body("model: H200\n    processes:\n      - {pid: 7, memory: 150754820100}"),
            "gpus[0].processes[0].memory",
            "140.4 GiB (150754820100 B) is more than the GPU's memory_total, 140.4 GiB (150754820096 B)",
        ),
        # What no driver reports: more than the link carries, a width no link has, power over the limit the board
        # holds, a PyTorch reserve larger than the process's memory.
        (
            body(GOOD_GPU + "\n    pcie: {tx: 20TB/s}"),
            "gpus[0].pcie.tx",
            "values must be between 0 B/s and 63 GB/s, got 20 TB/s",
        ),
        (body(GOOD_GPU + "\n    pcie: {width: 7}"), "gpus[0].pcie.width", "a PCIe link is x1, x2, x4, x8, x12, x16"),
        (
            body(GOOD_GPU + "\n    not_supported: [power, fan, power]"),
            "gpus[0].not_supported",
            "power is listed twice; list each feature once",
        ),
        (body(GOOD_GPU + "\n    power: 900"), "gpus[0].power", "values must be between 0 and 700, got 900"),
        (
            body(GOOD_GPU + "\n    processes: [{pid: 5, memory: 4GiB, torch: {data_wait: 0.1, allocated: 5GiB}}]"),
            "gpus[0].processes[0].torch.reserved",
            "must be at most the process's memory",
        ),
        # A GPU's index is not a key: it is the GPU's place in the list.
        (
            body(GOOD_GPU + "\n    index: 3"),
            "gpus[0].index",
            "a GPU's index is its position in the gpus list; remove index",
        ),
        (body() + 'driver: "545.23.08"\n', "driver", "unknown driver '545.23.08'; use a branch (r470"),
        (body() + "driver: r999\n", "driver", "unknown driver 'r999'"),
        (body() + 'driver: r535\ndriver_version: "535.54.03"\n', "driver_version", "give the driver once"),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 1GiB, every: 2}"),
            "gpus[0].processes[0]",
            "every and for go together",
        ),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 1GiB, every: 2, for: 2}"),
            "gpus[0].processes[0].for",
            "for (2) must be shorter than every (2)",
        ),
        (
            body(
                GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 1GiB, every: 2, for: 1}\n"
                "      - {pid: 9, memory: 1GiB}"
            ),
            "gpus[0].processes[1].pid",
            "the pids of pid 9 and pid 7 overlap",
        ),
        (body(GOOD_GPU + "\n    no_permission: [procesess]"), "gpus[0].no_permission[0]", "did you mean 'processes'?"),
        (body(GOOD_GPU + "\n    samples_when_idle: pause"), "gpus[0].samples_when_idle", "use one of continue, stop"),
        (
            body(extra="faults:\n  - {kind: processes_appear, gpu: 0, count: 0}"),
            "faults[0].count",
            "must be between 1 and 10000",
        ),
        (body(extra="faults:\n  - {kind: lost, gpu: 0, every: 10}"), "faults[0]", "every and for go together"),
        (
            body(extra="faults:\n  - {kind: function_not_found, function: nvmlInit}"),
            "faults[0].function",
            "cannot be removed",
        ),
        (
            body(extra="faults:\n  - {kind: function_not_found, function: nvmlDeviceGetFluxCapacitor}"),
            "faults[0].function",
            "unknown NVML function",
        ),
        # What no driver can return: nvml.h's NVML_DEVICE_NAME_V2_BUFFER_SIZE (96) and
        # NVML_DEVICE_SERIAL_BUFFER_SIZE (30) hold the text and its NUL.
        (
            body(f'model: "{"X" * 96}"\n    memory_total: 16GiB\n    power_limit: 100'),
            "gpus[0].model",
            "96 bytes is longer than the 95 nvmlDeviceGetName can return",
        ),
        (
            body(GOOD_GPU + f"\n    serial: '{'1' * 30}'"),
            "gpus[0].serial",
            "30 bytes is longer than the 29 nvmlDeviceGetSerial can return",
        ),
        # Memory processes hold at once, beside the driver's reserve, fits the GPU's or the instance's.
        (
            body(GOOD_GPU + "\n    memory_total: 100MiB"),
            "gpus[0].memory_total",
            "more than the driver's 512 MiB reserve",
        ),
        (
            body(
                GOOD_GPU
                + "\n    processes:\n      - {pid: 7, memory: 50GiB}\n      - {pid: 8, memory: 40GiB, start: 5}"
            ),
            "gpus[0].processes",
            "at 5 s processes [0] and [1] hold 90 GiB, more than the 79.1 GiB the GPU's memory_total leaves",
        ),
        (
            body(GOOD_GPU + "\n    processes:\n      - {pid: 7, memory: 79.5GiB}"),
            "gpus[0].processes",
            "at 0 s process [0] holds 79.5 GiB, more than the 79.1 GiB",
        ),
        (
            body(
                GOOD_GPU + "\n    mig:\n      - profile: 1g.10gb\n"
                "        processes: [{pid: 7, memory: 6GiB}, {pid: 8, memory: 6GiB}]"
            ),
            "gpus[0].mig[0].processes",
            "at 0 s processes [0] and [1] hold 12 GiB, more than the 1g.10gb instance's memory, 9.8 GiB",
        ),
    ],
)
def test_bad_scenarios_give_one_line_naming_file_place_and_fix(tmp_path, text, place, fix):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"scenario {path}: {place}: ")
    assert fix in message


def test_the_longest_name_and_serial_nvml_returns_load_and_read_back(tmp_path, clock):
    name, serial = "X" * 95, "1" * 29  # the buffers less the NUL (nvml.h)
    path = write(
        tmp_path, body(f'model: "{name}"\n    memory_total: 16GiB\n    power_limit: 100\n    serial: "{serial}"')
    )
    sim = started(load_scenario(path), clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert (sim.nvmlDeviceGetName(handle), sim.nvmlDeviceGetSerial(handle)) == (name, serial)


def test_processes_that_never_meet_may_hold_the_whole_memory_each(tmp_path, clock):
    # Memory is added up over the processes alive at the same time; one that comes back (every) counts
    # as alive from its start to its end (docs/scenarios.md).
    processes = (
        "\n    processes:\n      - {pid: 7, memory: 60GiB, end: 10}\n      - {pid: 8, memory: 60GiB, start: 10}"
        "\n      - {pid: 9, memory: 19GiB, every: 4, for: 1}"
    )
    sim = started(load_scenario(write(tmp_path, body(GOOD_GPU + processes))), clock)
    clock.t = 12.5  # pid 8 and an occurrence of pid 9
    memory = sim.nvmlDeviceGetMemoryInfo(sim.nvmlDeviceGetHandleByIndex(0))
    assert memory.used == (60 + 19) * 2**30 + DRIVER_RESERVE  # used = the processes' memory + the reserve


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "name: t\ndescription: d\ngpus:\n  - model: [unclosed\n  - x: : y\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert "\n" not in message
    assert re.match(rf"scenario {re.escape(path)}: line \d+: invalid YAML \(.+\)", message)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # PyYAML keeps the last of two equal keys and drops the first without a word.
        (
            body(GOOD_GPU + "\n    utilization: 50\n    utilization: 90"),
            "line 6: invalid YAML (key 'utilization' written",
        ),
        ("name: t\ndescription: d\ngpus:\n  - {model: H200, model: L4}\n", "line 4: invalid YAML (key 'model' written"),
    ],
)
def test_a_key_written_twice_is_refused(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value) == f"scenario {path}: {problem} twice); keep one of the two"


def test_a_merge_may_still_be_overridden(tmp_path):
    path = write(tmp_path, body("<<: {model: L4, utilization: 10}\n    utilization: 50"))
    assert load_scenario(path).gpus[0].utilization.value(0) == 50


def test_a_tab_in_the_indentation_says_to_use_spaces(tmp_path):
    path = write(tmp_path, "name: t\ndescription: d\ngpus:\n\t- model: H200\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value) == (
        f"scenario {path}: line 4: invalid YAML (found character '\\t' that cannot start any token); "
        "indent with spaces, not tabs"
    )


def test_default_bus_ids_stay_unique_past_a_baseboard(tmp_path):
    scenario = load_scenario(write(tmp_path, "name: t\ndescription: d\ngpus:\n" + "  - {model: L4}\n" * 100))
    buses = [g.pci_bus_id for g in scenario.gpus]
    assert len(set(buses)) == 100
    assert buses[8] == "00000000:E8:00.0" and buses[40] == "00000000:E8:01.0"


def test_default_serials_never_collide(tmp_path, monkeypatch):
    """Serials are derived from the seed and index modulo 10**13, so two could meet; the later steps on."""
    same_serial = lambda seed, index, salt: 10**13 + 41 if salt == 3 else (index << 8) ^ salt  # noqa: E731
    monkeypatch.setattr(scenario_module, "_derived_id", same_serial)
    gpus = load_scenario(write(tmp_path, "name: t\ndescription: d\ngpus:\n" + "  - {model: L4}\n" * 3)).gpus
    assert [g.serial for g in gpus] == ["0000000000041", "0000000000042", "0000000000043"]


def test_a_default_serial_given_to_another_gpu_is_refused(tmp_path):
    first = load_scenario(write(tmp_path, body("model: L4"), "one.yaml")).gpus[0].serial
    path = write(tmp_path, body(f"model: L4\n  - {{model: L4, serial: '{first}'}}"), "two.yaml")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value) == (
        f"scenario {path}: gpus[1].serial: {first} is also the serial of gpus[0]; give each GPU its own"
    )


def test_a_version_may_be_a_quoted_string(tmp_path):
    scenario = load_scenario(write(tmp_path, body() + 'driver: "535.104.05"\nnvml_version: "12.535.104.05"\n'))
    assert (scenario.driver_version, scenario.nvml_version) == ("535.104.05", "12.535.104.05")
    assert load_scenario(write(tmp_path, body() + "driver: r535\n", "branch.yaml")).driver.branch.name == "r535"


def test_missing_file_lists_builtins():
    with pytest.raises(ScenarioError) as caught:
        load_scenario("foo")
    assert str(caught.value) == (
        "scenario 'foo': no such file and no built-in of that name; built-ins are: " + ", ".join(BUILTINS)
    )


def test_a_folder_is_named_as_one(tmp_path):
    with pytest.raises(ScenarioError) as caught:
        load_scenario(str(tmp_path))
    assert str(caught.value) == f"scenario {str(tmp_path)!r} is a folder; name a scenario file in it, or a built-in"


def test_a_device_an_empty_file_and_a_huge_file_are_each_named_as_such(tmp_path):
    with pytest.raises(ScenarioError) as device:
        load_scenario(os.devnull)
    assert str(device.value) == f"scenario {os.devnull!r} is not a file (a device or a pipe); name a scenario file"
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ScenarioError) as nothing:
        load_scenario(str(empty))
    assert str(nothing.value) == (
        f"scenario {empty}: the file is empty; write a scenario in it (docs/scenarios.md), or name a built-in "
        "('gpulens scenarios' lists them)"
    )
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: x\n# " + "x" * (16 * 2**20) + "\n")
    with pytest.raises(ScenarioError) as long:
        load_scenario(str(huge))
    assert str(long.value) == (
        f"scenario {huge}: longer than 16 MiB, which no settings or scenario file needs; check its permissions"
    )


def test_scenario_error_is_a_value_error():
    assert issubclass(ScenarioError, ValueError)


def test_more_gpus_than_a_node_s_pci_addresses_hold_are_refused():
    """Past 1024 GPUs the default bus ids would need PCI device numbers above 1F, which no bus has."""
    many = "name: x\ndescription: d\ngpus:\n" + '  - {model: "NVIDIA L4"}\n' * 1025
    with pytest.raises(ScenarioError) as caught:
        scenario_module.parse_scenario(many, "big.yaml")
    assert (
        str(caught.value)
        == "scenario big.yaml: gpus: 1025 GPUs, more than the 1024 a node's PCI addresses here can hold"
    )
