#!/usr/bin/env bash
# Runs the download engine's tests with their temporary folders on tmpfs and on ramfs, beside
# the ext4 (or whatever holds TMPDIR) run of make test: the engine writes with O_DIRECT where the
# filesystem takes it (ext4; tmpfs since Linux 6.6) and falls back to the page cache where it is
# refused (ramfs), and its tests, the crash/resume and inline-CRC ones among them, must hold on
# each. Mounting needs root; without it this says so and runs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
	echo "test-filesystems: not root, so no tmpfs or ramfs to mount: the engine's tests ran only on $(findmnt -no FSTYPE -T "${TMPDIR:-/tmp}")"
	exit 0
fi

flags=${GO_TEST_FLAGS:--race -count=1 -timeout=20m}
mounts=()
cleanup() {
	for m in "${mounts[@]}"; do
		umount "$m" 2>/dev/null || umount -l "$m"
		rmdir "$m"
	done
}
trap cleanup EXIT

# ramfs keeps no extended attributes, which versitygw needs for its data, so the packages that
# start it (s3, sources) run on tmpfs only.
declare -A pkgs=(
	[tmpfs]="./pkg/engine/..."
	[ramfs]="./pkg/engine ./pkg/engine/peer ./pkg/engine/source/fs ./pkg/engine/source/hf"
)
for fs in tmpfs ramfs; do
	dir=$(mktemp -d "${TMPDIR:-/tmp}/prewarm-$fs-XXXXXX")
	opts=()
	[[ $fs == tmpfs ]] && opts=(-o size=2g)
	mount -t "$fs" "${opts[@]}" "$fs" "$dir"
	mounts+=("$dir")
	echo "engine tests with TMPDIR on $fs ($dir)"
	# shellcheck disable=SC2086 # the flags and package lists are words
	TMPDIR=$dir go test $flags ${pkgs[$fs]}
done
