#!/bin/bash
# Slurm epilog: write the gpulens report of the job that just ended on this node.
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/gpulens.sh   (or call it from your existing epilog)
#
# The report goes to $GPULENS_REPORT_DIR/<job id>.txt (default /var/lib/gpulens/reports), mode 0600 and
# owned by the job's user, and to standard output (for a run by hand with SLURM_JOB_ID set).
# It never fails: Slurm drains a node whose epilog exits non-zero, and a missing report is no reason to
# lose a node. A missing `gpulens` or `gpulens report`, a timeout or an error are logged, then skipped.
#
# Settings. slurmd runs an epilog with Slurm's variables only (no PATH, none of slurmd's environment), so
# they come from gpulens-epilog.conf beside slurm.conf (the folder of $SLURM_CONF, which slurmd sets),
# one KEY=VALUE a line; a variable already set in the environment (a run by hand) wins:
#   GPULENS_BIN             the gpulens command (default: gpulens on bash's default PATH, /usr/local/bin first)
#   GPULENS_REPORT_DIR      where reports go (default /var/lib/gpulens/reports)
#   GPULENS_REPORT_TIMEOUT  seconds the report may take; the node waits for it (default 20)
#   GPULENS_REPORT_ARGS     more arguments for `gpulens report job`, e.g. --ledger PATH or --min-duration 60s
#   GPULENS_EPILOG_LOG      a file to append this script's log lines to (default: syslog and stderr only)
# GPULENS_EPILOG_CONF, in the environment, names another settings file (a run by hand).
set -u

SETTINGS="${GPULENS_EPILOG_CONF:-$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")/gpulens-epilog.conf}"

log() {
  local line="$*"
  [ -z "${SLURM_JOB_ID:-}" ] || line="job $SLURM_JOB_ID: $line"
  echo "gpulens-epilog: $line" >&2
  command -v logger >/dev/null 2>&1 && logger -t gpulens-epilog -- "$line" 2>/dev/null
  if [ -n "${GPULENS_EPILOG_LOG:-}" ]; then
    printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$line" >>"$GPULENS_EPILOG_LOG" 2>/dev/null
  fi
  return 0
}

read_settings() {
  local file=$1 key value unknown=""
  [ -e "$file" ] || return 0
  if [ ! -r "$file" ]; then
    log "cannot read $file; using the defaults"
    return 0
  fi
  while IFS='=' read -r key value || [ -n "$key" ]; do
    key=${key#"${key%%[![:space:]]*}"}
    key=${key%"${key##*[![:space:]]}"}
    case $key in
      '' | '#'*) continue ;;
      GPULENS_BIN | GPULENS_REPORT_DIR | GPULENS_REPORT_TIMEOUT | GPULENS_REPORT_ARGS | GPULENS_EPILOG_LOG)
        value=${value%%[[:space:]]#*}              # a comment after the value
        value=${value#"${value%%[![:space:]]*}"}   # blanks around it
        value=${value%"${value##*[![:space:]]}"}
        value=${value#\"}
        value=${value%\"}
        [ -n "${!key:-}" ] || printf -v "$key" '%s' "$value"
        ;;
      *) unknown="$unknown $key" ;;
    esac
  done <"$file"
  [ -z "$unknown" ] || log "$file: unknown setting(s)$unknown ignored; known: GPULENS_BIN, GPULENS_REPORT_DIR, GPULENS_REPORT_TIMEOUT, GPULENS_REPORT_ARGS, GPULENS_EPILOG_LOG"
}

report_job() {
  local job=${SLURM_JOB_ID:-}
  if [ -z "$job" ]; then
    log "SLURM_JOB_ID is not set; run this as a Slurm epilog"
    return
  fi
  if ! command -v "$GPULENS" >/dev/null 2>&1; then
    log "'$GPULENS' is not installed here; no report (set GPULENS_BIN in $SETTINGS)"
    return
  fi
  case $TIMEOUT in
    '' | *[!0-9]*)
      log "GPULENS_REPORT_TIMEOUT '$TIMEOUT' is not a whole number of seconds; using 20"
      TIMEOUT=20
      ;;
  esac
  local report status
  # shellcheck disable=SC2086 # GPULENS_REPORT_ARGS is a list of arguments
  # --ended: the job is over, though the agent keeps it open a few minutes in case its processes come back.
  report=$(timeout "$TIMEOUT" "$GPULENS" report job "$job" --ended ${GPULENS_REPORT_ARGS:-} 2>&1)
  status=$?
  if [ "$status" -eq 124 ]; then
    log "the report took longer than ${TIMEOUT}s; skipped"
    return
  fi
  if [ "$status" -ne 0 ]; then
    # An older gpulens without `report` answers "unknown command"; either way, say why in one line.
    log "no report (exit $status): $(printf '%s' "$report" | tail -n 1)"
    return
  fi
  printf '%s\n' "$report"
  # 0755: each user must reach the folder to read their own report (0600) in it, whatever slurmd's umask.
  if mkdir -p -m 0755 "$REPORT_DIR" 2>/dev/null; then
    local file="$REPORT_DIR/$job.txt"
    (umask 077 && printf '%s\n' "$report" >"$file") || { log "cannot write $file"; return; }
    if [ -n "${SLURM_JOB_UID:-}" ]; then
      chown "$SLURM_JOB_UID" "$file" 2>/dev/null || log "cannot give $file to uid $SLURM_JOB_UID"
    fi
  else
    log "cannot create $REPORT_DIR"
  fi
}

read_settings "$SETTINGS"
GPULENS=${GPULENS_BIN:-gpulens}
TIMEOUT=${GPULENS_REPORT_TIMEOUT:-20}
REPORT_DIR=${GPULENS_REPORT_DIR:-/var/lib/gpulens/reports}
report_job
exit 0
