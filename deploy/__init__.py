"""What gpulens ships for the systems around it (Grafana, Alertmanager, Prometheus, systemd, Slurm), in
the package as `gpulens.deploy`; `gpulens files` lists and prints them (gpulens/bundled.py)."""
