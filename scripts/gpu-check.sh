#!/usr/bin/env bash
# The GPU proof (docs/minion-jobs.md, "GPUs: the CDI spec"): run as root on a machine with an NVIDIA GPU
# and its driver, from a checkout whose .venv is built (`make deps` here, then carried in; it needs no
# network). Prints one PASS/FAIL line per check (scripts/gpu-check/checks.py) and exits 0 when all pass;
# stops itself after 7.5 minutes. The CUDA probe is built with gcc when there is one, else
# GPU_CHECK_PROBE names a prebuilt one (`gcc -O2 -o P scripts/gpu-check/cuda_probe.c -ldl`).
# podman's runtime settings come from the minion's own variables (RIGBASE_JOBS_OCI_RUNTIME, …).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "FAIL setup: run as root (podman rootful, the CDI spec in /var/run/cdi)"
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "FAIL setup: no .venv here: run \`make deps\` where there is a network and carry .venv in"
  exit 1
fi
exec timeout --signal=TERM 450 .venv/bin/python scripts/gpu-check/checks.py
