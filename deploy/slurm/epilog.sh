#!/bin/bash
# Slurm epilog: write the gpulens report of the job that just ended on this node.
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/gpulens.sh   (or call it from your existing epilog)
#
# The report goes to $GPULENS_REPORT_DIR/<job id>.txt (default /var/lib/gpulens/reports), readable by
# the job's owner, and to standard output (for a TaskEpilog, or a run by hand with SLURM_JOB_ID set).
# It never fails: Slurm drains a node whose epilog exits non-zero, and a missing report is no reason to
# lose a node. A missing `gpulens` or `gpulens report`, a timeout or an error are logged, then skipped.
set -u

GPULENS=${GPULENS_BIN:-gpulens}
TIMEOUT=${GPULENS_REPORT_TIMEOUT:-20}  # seconds; the epilog holds the node until it ends
REPORT_DIR=${GPULENS_REPORT_DIR:-/var/lib/gpulens/reports}

log() {
  echo "gpulens-epilog: $*" >&2
  command -v logger >/dev/null 2>&1 && logger -t gpulens-epilog -- "$*" 2>/dev/null
  return 0
}

report_job() {
  local job=${SLURM_JOB_ID:-}
  if [ -z "$job" ]; then
    log "SLURM_JOB_ID is not set; run this as a Slurm epilog"
    return
  fi
  if ! command -v "$GPULENS" >/dev/null 2>&1; then
    log "job $job: '$GPULENS' is not installed here; no report (set GPULENS_BIN to its path)"
    return
  fi
  local report status
  report=$(timeout "$TIMEOUT" "$GPULENS" report job "$job" 2>&1)
  status=$?
  if [ "$status" -eq 124 ]; then
    log "job $job: the report took longer than ${TIMEOUT}s; skipped"
    return
  fi
  if [ "$status" -ne 0 ]; then
    # An older gpulens without `report` answers "unknown command"; either way, say why in one line.
    log "job $job: no report (exit $status): $(printf '%s' "$report" | tail -n 1)"
    return
  fi
  printf '%s\n' "$report"
  if mkdir -p "$REPORT_DIR" 2>/dev/null; then
    local file="$REPORT_DIR/$job.txt"
    (umask 077 && printf '%s\n' "$report" >"$file") || { log "job $job: cannot write $file"; return; }
    if [ -n "${SLURM_JOB_UID:-}" ]; then
      chown "$SLURM_JOB_UID" "$file" 2>/dev/null || log "job $job: cannot give $file to uid $SLURM_JOB_UID"
    fi
  else
    log "job $job: cannot create $REPORT_DIR"
  fi
}

report_job
exit 0
