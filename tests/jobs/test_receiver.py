"""The receiver, through a real Unix datagram socket: who may speak, how much, for how long."""

from __future__ import annotations

import array
import json
import logging
import os
import socket
import stat
import threading

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.jobs.messages import MAX_MESSAGE_BYTES
from gpulens.agent.jobs.receiver import Receiver, ReceiverError, unreachable
from tests.jobs.helpers import processed, send, send_from_child, wait_until


def own(message: dict) -> dict:
    """Return `message` claiming this process's pid, as an honest job's would."""
    return {**message, "pid": os.getpid()}


def test_a_report_is_kept_under_the_kernel_verified_pid_with_uid(receiver, socket_path, message):
    clock = ManualClock(start=100.0)
    r = receiver(clock=clock.monotonic)
    send(socket_path, own(message()))
    processed(r, 1)
    latest = r.latest()
    assert list(latest) == [os.getpid()]
    report = latest[os.getpid()]
    assert report.pid == os.getpid()
    assert report.uid == os.getuid()
    assert report.received_at == 100.0
    assert report.step.count == 100
    assert r.counters()["accepted"] == 1


def test_the_socket_is_writable_by_any_user_and_removed_on_stop(receiver, socket_path):
    r = receiver()
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o666
    # Search permission for all is what sending needs; nobody but the agent may write in the directory.
    assert stat.S_IMODE(os.stat(os.path.dirname(socket_path)).st_mode) & 0o777 == 0o755
    r.stop()
    assert not os.path.exists(socket_path)


def test_a_report_claiming_another_pid_is_dropped_and_counted(receiver, socket_path, message):
    r = receiver()
    send(socket_path, message(pid=os.getpid() + 1))
    processed(r, 1)
    assert r.latest() == {}
    assert r.counters()["pid_mismatch"] == 1


def test_a_child_process_cannot_speak_for_its_parent(receiver, socket_path, message):
    r = receiver()
    child = send_from_child(socket_path, own(message()))
    processed(r, 1)
    assert child != os.getpid()
    assert r.latest() == {}
    assert r.counters()["pid_mismatch"] == 1


def test_a_child_speaking_for_itself_is_accepted(receiver, socket_path, message):
    r = receiver()
    child = send_from_child(socket_path, message(pid=None))
    processed(r, 1)
    assert list(r.latest()) == [child]


def test_a_job_in_a_container_may_claim_its_pid_in_its_own_namespace(receiver, socket_path, message, tmp_path):
    # The kernel gives the host pid; the job knows only its container pid, which /proc/<pid>/status lists.
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "status").write_text(f"Name:\tpython\nNSpid:\t{os.getpid()}\t7\n")
    r = receiver(proc_root=str(proc))
    send(socket_path, message(pid=7))
    send(socket_path, message(pid=8))
    processed(r, 2)
    assert list(r.latest()) == [os.getpid()]
    assert r.latest()[os.getpid()].pid == os.getpid()  # kept under the host pid, as NVML reports it
    assert r.counters()["pid_mismatch"] == 1


def test_a_datagram_over_the_limit_is_truncated_by_the_kernel_and_dropped(receiver, socket_path, message, caplog):
    caplog.set_level(logging.INFO)
    r = receiver()
    data = json.dumps(own(message())).encode()
    send(socket_path, data + b" " * (MAX_MESSAGE_BYTES - len(data)))  # exactly the limit: fine
    send(socket_path, data + b" " * (MAX_MESSAGE_BYTES + 1 - len(data)))
    processed(r, 2)
    counts = r.counters()
    assert counts["accepted"] == 1 and counts["truncated"] == 1
    said = [m for m in caplog.messages if "rejected a report" in m]
    assert said == [f"rejected a report from pid {os.getpid()}: over {MAX_MESSAGE_BYTES} bytes (uid {os.getuid()})"]


def test_each_process_gets_a_burst_then_a_steady_rate(receiver, socket_path, message, caplog):
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    r = receiver(clock=clock.monotonic, burst=10, rate_per_second=2.0)
    for _ in range(12):
        send(socket_path, own(message()))
    processed(r, 12)
    assert r.counters()["accepted"] == 10
    assert r.counters()["rate_limited"] == 2
    clock.advance(0.5)  # one token back
    send(socket_path, own(message()))
    send(socket_path, own(message()))
    processed(r, 14)
    assert r.counters()["accepted"] == 11
    assert r.counters()["rate_limited"] == 3
    said = [m for m in caplog.messages if "dropped reports" in m]  # once per process, not once per report
    assert said == [f"dropped reports from pid {os.getpid()}: more than 2 a second (after a burst) (uid {os.getuid()})"]


def test_a_job_that_stops_reporting_expires(receiver, socket_path, message):
    clock = ManualClock()
    r = receiver(clock=clock.monotonic, expiry_seconds=60.0)
    send(socket_path, own(message()))
    processed(r, 1)
    clock.advance(59.0)
    assert os.getpid() in r.latest()
    clock.advance(2.0)
    assert r.latest() == {}


def test_a_job_that_sends_only_bad_reports_after_a_good_one_expires_all_the_same(receiver, socket_path, message):
    clock = ManualClock()
    r = receiver(clock=clock.monotonic)
    send(socket_path, own(message()))
    processed(r, 1)
    clock.advance(40.0)
    send(socket_path, b"{}")
    processed(r, 2)
    clock.advance(40.0)
    assert r.latest() == {}


def test_the_number_of_processes_tracked_is_bounded(receiver, socket_path, message):
    clock = ManualClock()
    r = receiver(clock=clock.monotonic, max_jobs=1)
    send(socket_path, own(message()))
    processed(r, 1)
    send_from_child(socket_path, message(pid=None))
    processed(r, 2)
    # The job already watched keeps its place; the newcomer is refused.
    assert list(r.latest()) == [os.getpid()]
    assert r.counters()["too_many_jobs"] == 1
    clock.advance(61.0)  # the first job has gone quiet and expires: room again
    child = send_from_child(socket_path, message(pid=None))
    processed(r, 3)
    assert list(r.latest()) == [child]


def test_bad_input_is_counted_and_the_receiver_goes_on(receiver, socket_path, message):
    r = receiver()
    send(socket_path, b"\x00\xff garbage")
    send(socket_path, b"")
    send(socket_path, json.dumps({**own(message()), "v": 2}).encode())
    send(socket_path, own(message()))
    processed(r, 4)
    counts = r.counters()
    assert counts["bad_message"] == 3
    assert counts["accepted"] == 1
    assert counts["received"] == 4
    assert sum(counts[k] for k in counts if k != "received") == counts["received"]


def test_file_descriptors_sent_to_the_agent_are_never_installed(receiver, socket_path, message):
    r = receiver()
    before = len(os.listdir("/proc/self/fd"))
    with open(os.devnull) as passed, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [passed.fileno()] * 4))]
        s.sendmsg([json.dumps(own(message())).encode()], rights, 0, socket_path)
        processed(r, 1)
        assert len(os.listdir("/proc/self/fd")) == before + 2  # the file and the sending socket, no more
    assert r.counters()["accepted"] == 1


def test_a_stale_socket_is_replaced(socket_path, receiver, message):
    os.makedirs(os.path.dirname(socket_path))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as left_behind:
        left_behind.bind(socket_path)
    r = receiver()
    send(socket_path, own(message()))
    processed(r, 1)
    assert r.counters()["accepted"] == 1


def test_a_live_receiver_is_not_stolen_from(receiver, socket_path):
    receiver()
    with pytest.raises(ReceiverError, match="another process is already receiving job reports on .*jobs.sock"):
        Receiver(socket_path=socket_path).start()


def test_a_file_in_the_way_is_not_removed(socket_path):
    os.makedirs(os.path.dirname(socket_path))
    with open(socket_path, "w") as f:
        f.write("precious")
    with pytest.raises(ReceiverError, match="exists and is not a socket; remove it or choose another socket path"):
        Receiver(socket_path=socket_path).start()
    assert open(socket_path).read() == "precious"


def test_a_directory_that_cannot_be_made_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReceiverError, match=r"cannot listen for jobs on .*: .*; give gpulens write access"):
        Receiver(socket_path=str(blocker / "jobs.sock")).start()


def test_only_the_socket_s_own_folder_is_made_not_a_mistyped_path(tmp_path):
    made = Receiver(socket_path=str(tmp_path / "gpulens" / "jobs.sock"))  # as /run/gpulens under /run
    made.start()
    made.stop()
    assert (tmp_path / "gpulens").is_dir()
    mistyped = tmp_path / "nonexistent" / "x"
    with pytest.raises(ReceiverError) as raised:
        Receiver(socket_path=str(mistyped / "jobs.sock")).start()
    assert str(raised.value) == (
        f"cannot listen for jobs on {mistyped}/jobs.sock: the folder {tmp_path}/nonexistent does not exist, and "
        f"only the socket's own folder is made; fix the socket path (--jobs.socket) or create {tmp_path}/nonexistent"
    )
    assert not (tmp_path / "nonexistent").exists()


def test_the_socket_s_folder_lets_every_user_reach_it_whatever_the_umask(tmp_path):
    """Under systemd's UMask=0077 the folder was made 0700, and every other user's job reported nothing, unsaid."""
    old = os.umask(0o077)
    try:
        made = Receiver(socket_path=str(tmp_path / "gpulens" / "jobs.sock"))
        made.start()
        made.stop()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "gpulens").stat().st_mode) == 0o755
    assert unreachable(str(tmp_path / "gpulens" / "jobs.sock")) == ""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    assert unreachable(str(closed / "jobs.sock")) == (
        f"the folder {closed} of the jobs' socket is mode 0700: jobs of users other than its owner cannot reach the "
        f"socket and send no reports; chmod o+x {closed}"
    )


def test_a_socket_path_too_long_for_a_socket_says_so(tmp_path):
    path = str(tmp_path / ("a" * 120) / "jobs.sock")
    with pytest.raises(ReceiverError, match=r"AF_UNIX path too long; choose a shorter socket path \(a socket's"):
        Receiver(socket_path=path).start()


def test_each_accepted_report_is_handed_on_and_stop_handles_what_was_queued(receiver, socket_path, message):
    handed, release = [], threading.Event()

    def on_accept(report):
        handed.append(report)
        release.wait(5)  # the first report holds the loop while the others queue up

    r = receiver(on_accept=on_accept)
    for count in range(1, 6):
        send(socket_path, own(message(step={"count": count, "data_wait_seconds": 0.0, "total_seconds": 1.0})))
    wait_until(lambda: len(handed) == 1)
    threading.Timer(0.2, release.set).start()  # after stop() has begun: the queue is drained, not dropped
    r.stop()
    assert [report.step.count for report in handed] == [1, 2, 3, 4, 5]
    assert all(report.pid == os.getpid() and report.received_at is not None for report in handed)
    assert r.counters()["accepted"] == 5
