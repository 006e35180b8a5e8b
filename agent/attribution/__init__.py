"""Attribution: which job, pod or user each GPU process belongs to, and what its host side is doing.

Pure cgroup parsers (`cgroup`), /proc reads (`proc`), the kubelet pod-resources client (`podresources`),
the pid-to-job resolver (`resolver`), what a job asked for (`request`, pure; a pod's from its cgroup limits,
`limits`) and the host CPU, memory and I/O sampler (`hostusage`). See
docs/attribution.md for what each kind needs and what it cannot see.
"""
