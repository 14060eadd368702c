#!/usr/bin/env bash
# Stop what tools/cluster/up.sh started, and only that: the pid files it listed in $STATE/started, newest first.
# Data (accounting DB, PostgreSQL, SLURM state) stays in $STATE, so the next `up` is quick; remove $STATE to reset.
set -uo pipefail
STATE=${PIPELINE_CLUSTER_DIR:-/var/tmp/pipeline-cluster}
[ -s "$STATE/started" ] || { echo "cluster: nothing to stop (no $STATE/started)"; exit 0; }

stop() {  # stop PIDFILE: SIGTERM, wait up to 30 s, then SIGKILL
  local pidfile=$1 pid name
  [ -s "$pidfile" ] || return 0
  pid=$(head -1 "$pidfile")
  kill -0 "$pid" 2>/dev/null || return 0
  name=$(ps -o comm= -p "$pid")
  kill -TERM "$pid"
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || { echo "cluster: stopped $name ($pid)"; return 0; }; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null && echo "cluster: killed $name ($pid) after 30 s"
}
tac "$STATE/started" | while read -r pidfile; do stop "$pidfile"; done
rm -f "$STATE/started"
