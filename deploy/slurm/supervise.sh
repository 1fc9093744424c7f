#!/usr/bin/env bash
# Runs one role's command and starts it again when it fails, as `turnstream up` does locally with
# [launch] restart = "on-failure": a back-off that doubles with each restart in the window, and after
# MAX_RESTARTS restarts within RESTART_WINDOW_S seconds the next failure is final (this script then exits
# with the role's status, and the job's `wait -n` ends the job). A role that exits 0 (the learner at
# learner.max_steps) is done. SIGTERM (scancel, the job's time limit) is passed on to the role, which stops
# gracefully (actors drain, the learner checkpoints, the buffer syncs its log).
#   supervise.sh COMMAND [ARGS...]
set -uo pipefail

MAX_RESTARTS="${MAX_RESTARTS:-5}"             # launch.max_restarts
RESTART_WINDOW_S="${RESTART_WINDOW_S:-600}"   # launch.restart_window_s
BACKOFF_INITIAL_S="${BACKOFF_INITIAL_S:-1}"   # launch.backoff_initial_s
BACKOFF_MAX_S="${BACKOFF_MAX_S:-30}"          # launch.backoff_max_s

restarts=()  # epoch seconds of the restarts still inside the window
child=0
stopping=0
on_term() {
  stopping=1
  [ "$child" -gt 0 ] && kill -TERM "$child" 2>/dev/null
}
trap on_term TERM INT

while true; do
  "$@" &
  child=$!
  wait "$child"
  status=$?
  if [ "$stopping" -eq 1 ]; then  # the first wait returns on the signal: wait for the role's own exit
    wait "$child"
    exit $?
  fi
  [ "$status" -eq 0 ] && exit 0
  now=$(date +%s)
  kept=()
  for t in ${restarts[@]+"${restarts[@]}"}; do
    (( now - t <= RESTART_WINDOW_S )) && kept+=("$t")
  done
  restarts=(${kept[@]+"${kept[@]}"})
  if (( ${#restarts[@]} >= MAX_RESTARTS )); then
    echo "supervise: $* failed with status $status after ${#restarts[@]} restarts within ${RESTART_WINDOW_S}s; giving up" >&2
    exit "$status"
  fi
  delay=$(awk -v a="$BACKOFF_INITIAL_S" -v m="$BACKOFF_MAX_S" -v n="${#restarts[@]}" \
          'BEGIN { d = a * 2 ^ n; if (d > m) d = m; print d }')
  echo "supervise: $* failed with status $status; restart $(( ${#restarts[@]} + 1 )) in ${delay}s" >&2
  sleep "$delay" & child=$!
  wait "$child"
  [ "$stopping" -eq 1 ] && exit 143
  restarts+=("$now")
done
