"""A training job for the Slurm tests: a small model on the CPU fed by a slow DataLoader.

The dataset decodes each sample on the CPU (a busy loop standing in for JPEG decoding), and the loader has
`num_workers=0`, so the main process does the decoding and each step waits for its batch: the job a
starved GPU holds. It writes its pid where the scenario's `host_process` looks for the process on the GPU
that Slurm gave it (`CUDA_VISIBLE_DEVICES`), reports through `gpulens.torch`, and trains until the stop
file appears or the time runs out.

    python train.py PID_FOLDER STOP_FILE SECONDS
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import gpulens.torch


class SlowDecode(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int):
        end = time.perf_counter() + 0.004  # decoding one sample keeps the main process busy
        while time.perf_counter() < end:
            pass
        return torch.randn(32), torch.randn(1)


def main() -> None:
    pid_folder, stop_file, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    gpu = os.environ["CUDA_VISIBLE_DEVICES"]
    with open(os.path.join(pid_folder, f"gpu{gpu}.pid"), "w") as file:
        file.write(str(os.getpid()))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDecode(), batch_size=16, num_workers=0)
    deadline = time.monotonic() + seconds
    for x, y in gpulens.torch.instrument(loader, model=model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if os.path.exists(stop_file) or time.monotonic() > deadline:
            break
    print("trained", flush=True)


if __name__ == "__main__":
    main()
