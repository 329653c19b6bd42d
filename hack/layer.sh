#!/usr/bin/env bash
# Runs one layer of make test: prints its name, runs the command, and prints whether it passed
# and how long it took. A failing layer stops make test there, so a lint error or a unit failure
# is reported in minutes, before the test binaries are built or the suites start.
#
#   hack/layer.sh NAME [--say TEXT] COMMAND [ARG...]
#
# --say TEXT is printed instead of the command (a long package list, for one).
set -uo pipefail
name=$1
shift
say=
if [[ "${1:-}" == --say ]]; then
  say=$2
  shift 2
fi
printf '\n==> layer %s: %s\n' "$name" "${say:-$*}"
start=$SECONDS
"$@"
rc=$?
took=$((SECONDS - start))
if ((rc == 0)); then
  printf '==> layer %s passed in %dm%02ds\n' "$name" $((took / 60)) $((took % 60))
else
  printf '==> layer %s FAILED (exit %d) after %dm%02ds; the layers after it did not run\n' "$name" "$rc" $((took / 60)) $((took % 60))
fi
exit "$rc"
