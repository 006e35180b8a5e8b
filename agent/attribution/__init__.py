"""Attribution: which job, pod or user each GPU process belongs to, and what its host side is doing.

Pure cgroup parsers (`cgroup`), /proc reads (`proc`), the kubelet pod-resources client (`podresources`),
the pid-to-job resolver (`resolver`) and the host CPU and I/O sampler (`hostusage`). See
docs/attribution.md for what each kind needs and what it cannot see.
"""
