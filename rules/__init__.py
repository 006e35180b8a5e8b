"""gpulens' Prometheus rules (alerts, recording, probes) and their promtool unit tests, shipped in the
package as `gpulens.rules`; `gpulens rules` prints them (gpulens/bundled.py)."""
