"""The probe recording rules: valid, unit-tested with promtool, and the test can fail."""

import pathlib
import subprocess

from tests.tools import require_tool

RULES = pathlib.Path(__file__).resolve().parents[2] / "rules"
RULE_FILE = RULES / "probes.rules.yml"
TEST_FILE = RULES / "tests" / "probes.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_probe_rules():
    done = promtool("check", "rules", str(RULE_FILE))
    assert done.returncode == 0 and "SUCCESS: 7 rules found" in done.stdout, done.stdout + done.stderr


def test_the_fleet_median_rules_pass_their_unit_tests():
    done = promtool("test", "rules", str(TEST_FILE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_tests_fail_when_the_slow_gpu_is_not_found(tmp_path):
    broken = TEST_FILE.read_text().replace("../probes.rules.yml", str(RULE_FILE))
    # B's matmuls as fast as its peers: the "which H100 is slower" query must now miss it.
    broken = broken.replace("values: '600e12x10'", "values: '800e12x10'")
    target = tmp_path / "broken.test.yml"
    target.write_text(broken)
    done = promtool("test", "rules", str(target))
    assert done.returncode != 0 and "min_ratio_model_median" in done.stdout + done.stderr
