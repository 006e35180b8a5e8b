"""What training jobs tell the agent about themselves, over a Unix datagram socket.

A job instrumented with `gpulens.torch` sends a small JSON report every few seconds: how long its steps
wait for data, its DataLoader settings, mixed precision and TF32, its device and PyTorch allocator
statistics, which only the job itself can read. `messages` parses and bounds a report (pure, no I/O),
`receiver` takes datagrams off the socket and checks who sent them with the kernel's credentials,
`metrics` turns the latest reports into Prometheus series. Nothing here imports torch.
"""
