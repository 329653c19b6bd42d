#!/usr/bin/env bash
# Runs a command beside another: SIDE in the background, its output kept in a file, and MAIN in
# the foreground; then waits for SIDE, prints its output (after MAIN's, not interleaved with it)
# and fails if either failed. make test runs the oldest Kubernetes' build and suites beside the
# end-to-end and real-node suites, which leave about half of the cores idle while they wait on
# their clusters.
#
#   hack/beside.sh 'SIDE COMMAND' MAIN [ARG...]
set -uo pipefail
side=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
took="$log.took"
(
  start=$SECONDS
  bash -c "$side"
  rc=$?
  echo $((SECONDS - start)) >"$took"
  exit "$rc"
) >"$log" 2>&1 &
pid=$!
# Should this script end before it has waited for SIDE, SIDE is stopped too.
trap 'kill "$pid" 2>/dev/null; rm -f "$log" "$took"' EXIT
"$@"
main_rc=$?
wait "$pid"
side_rc=$?
secs=$(cat "$took" 2>/dev/null || echo 0)
rm -f "$took"
trap 'rm -f "$log"' EXIT
printf '\n--- beside it: %s (exit %d after %dm%02ds)\n' "$side" "$side_rc" $((secs / 60)) $((secs % 60))
cat "$log"
((main_rc == 0 && side_rc == 0))
