"""What an answer without end costs `gpulens report`: time and peak memory against a server on loopback that
answers every query with 1.2 GB (a proxy gone wrong, or another program at the URL).

    python bench/oversized_answer.py

The report reads each answer up to gpulens.httpclient.MAX_ANSWER_BYTES and within --timeout, then says so in
one line and exits 1; this prints its exit status, wall time and peak resident memory (getrusage of the child).
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import threading
import time

SIZE = 1200 << 20
CHUNK = b" " * (1 << 20)


def serve(listener: socket.socket) -> None:
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=answer, args=(connection,), daemon=True).start()


def answer(connection: socket.socket) -> None:
    with connection:
        try:
            connection.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {SIZE}\r\n\r\n"
            connection.sendall(head.encode())
            for _ in range(SIZE // len(CHUNK)):
                connection.sendall(CHUNK)
        except OSError:
            pass  # the client stopped reading, as it should


def main() -> int:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "report", "fleet", "--since", "1d", "--prometheus", url],
        capture_output=True,
        text=True,
        timeout=600,
    )
    elapsed = time.monotonic() - started
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"exit {done.returncode}, {elapsed:.2f} s, peak RSS {peak_mib:.0f} MiB: {done.stderr.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
