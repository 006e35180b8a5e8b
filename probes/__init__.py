"""Probe kernels: is each GPU as fast as its datasheet and its identical peers?

`specs` holds the datasheet peaks; `kernels` (torch) measures copies and matmuls; `runner` runs the set
on one GPU under the `safety` guard and budget; `cli` is `gpulens probe` and `python -m gpulens.probes`;
`simulated` answers for a simulated node; `child` is how the agent runs a probe in its own process.
Only `kernels`, `runner` and the paths of `cli` that run kernels import torch.
"""
