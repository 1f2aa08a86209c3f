#!/usr/bin/env bash
# `make test`: the whole suite in two streams side by side. The image suite (two image builds, then QEMU
# under TCG with one vCPU: one core busy, mostly waiting on the guest) runs in the background while the rest
# of the suite runs in the foreground; together they take about as long as the image suite alone instead of
# the sum. The GCP suite (its own `unshare -n` run, a few minutes) goes with the image stream, which
# balances the two. The whole node life in a VM is `make test-vm`, a Vagrant VM's join `make test-vagrant`
# and an image with the NVIDIA driver compiled in `make test-nvidia`: beside the rest of the suite, they take
# longer than the suite's budget. Each stream has its own --basetemp; the image stream's output is printed after the rest's.
# Extra arguments go to both pytest runs (e.g. -x, -k).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
base="${RIGBASE_TEST_BASETEMP:-/tmp/rigbase-tests}"
mkdir -p "$base"
image_log="$base/image-suite.log"

"$PY" -m pytest -q --durations=10 -p no:cacheprovider --basetemp="$base/image" "$@" tests/image_builder \
  --ignore=tests/image_builder/test_node_life_vm.py --ignore=tests/image_builder/test_vagrant_join.py \
  --ignore=tests/image_builder/test_nvidia_image.py \
  tests/provisioner/gcp >"$image_log" 2>&1 &
image_pid=$!
trap 'kill "$image_pid" 2>/dev/null; wait "$image_pid" 2>/dev/null' INT TERM

"$PY" -m pytest -q --durations=15 --basetemp="$base/rest" "$@" tests --ignore=tests/image_builder \
  --ignore=tests/provisioner/gcp
rest=$?

echo
echo "==== tests/image_builder and tests/provisioner/gcp (ran beside the rest; log: $image_log) ===="
wait "$image_pid"
image=$?
cat "$image_log"
echo "==== exit: rest of the suite $rest, image suite $image ===="
[ "$rest" -eq 0 ] && [ "$image" -eq 0 ]
