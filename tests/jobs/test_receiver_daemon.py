"""The agent keeps serving metrics when the in-job channel cannot listen."""

import urllib.request

import pytest

from tests.jobs.helpers import start_agent


@pytest.mark.slow
def test_a_file_in_the_way_of_the_jobs_socket_disables_only_the_channel(tmp_path):
    in_the_way = tmp_path / "jobs.sock"
    in_the_way.write_text("not a socket")
    agent = start_agent(tmp_path, str(in_the_way))
    try:
        line = agent.stdout.readline()
        assert line.startswith("gpulens agent listening on http://127.0.0.1:"), agent.stderr.read()
        with urllib.request.urlopen(line.split()[-1], timeout=10) as response:
            assert b"gpulens_nvml_up" in response.read()
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    stderr = agent.stderr.read()
    assert "in-job reports disabled: " in stderr and "exists and is not a socket" in stderr
    assert "Traceback" not in stderr
