#!/usr/bin/env bash
# demo.sh - set everything up, build, and run ckptio's main job: a save/load
# benchmark in host memory against the raw disk ceilings measured in the same run.
# Extra arguments go to `ckptio bench` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/ckptio bench "$@"
