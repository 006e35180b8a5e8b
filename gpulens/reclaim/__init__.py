"""`gpulens reclaim`: from a GPU held with no work to a GPU given back, by policy, with warnings first.

A service of its own, apart from the agents, which keep no rights over jobs: it reads the verdicts through
the read layer (gpulens.fleet), decides with `ladder`, acts through the scheduler (`slurm`), and writes every
decision to its folder (`folder`). docs/reclaim.md tells how to roll it out.
"""
