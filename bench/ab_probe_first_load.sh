#!/usr/bin/env bash
# ab_probe_first_load.sh - a process's first GPU load of a model directory, variants alternating in fresh
# processes (bench/probe_first_load.py: one process, a first load and a second): the quick A/B of issue 17's
# sessions, lighter than bench/ab_first_loads.sh (no peers, no bench_model_gpu.py).
#
#   bench/ab_probe_first_load.sh DIR ROUNDS TAG VARIANT...
#
# VARIANT is NAME=VENV or NAME=VENV:VAR=VALUE[,VAR=VALUE...]: the ckptio installed in the virtual environment
# VENV (scripts/install_wheel.sh WHEEL VENV), with those environment variables, e.g.
#   old=/tmp/old new=/tmp/new pair=/tmp/new:CKPTIO_TEST_PIN_TOGETHER=1
# Each round runs every variant once, the order rotated by one each round. Per load: a line on stdout and a
# JSON line {"case": TAG, "round", "variant", "row": probe_first_load.py's output} appended to
# $OUT/ab_probe.jsonl (OUT default .). At the end, per variant: the first loads' median GB/s and range, and
# the rounds it led the first variant in. SECOND (default reuse) is passed to the probe. WARM=1 (default)
# reads DIR's files once before each round, so that a page-cache A/B stays one whatever ran before it
# (`ckptio bench`, which tests/python/test_model_dir.py runs, drops the whole page cache when run as root: a
# seventeenth-session A/B read cold after those tests); WARM=0 leaves the cache as it is.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ $# -ge 4 ] || { sed -n 2,17p "$0"; exit 2; }
dir=$1 rounds=$2 tag=$3
shift 3
variants=("$@")
out=${OUT:-.}/ab_probe.jsonl
mkdir -p "$(dirname "$out")"
n=${#variants[@]}
for r in $(seq 1 "$rounds"); do
    [ "${WARM:-1}" = 1 ] && cat "$dir"/* > /dev/null 2>&1
    for k in $(seq 0 $((n - 1))); do
        spec=${variants[$(((k + r - 1) % n))]}
        name=${spec%%=*} rest=${spec#*=}
        venv=${rest%%:*} envs=()
        [ "$rest" != "$venv" ] && IFS=, read -r -a envs <<< "${rest#*:}"
        line=$(env "${envs[@]}" PATH="$venv/bin:$PATH" SECOND="${SECOND:-reuse}" timeout 120 \
            python3 bench/probe_first_load.py "$dir" plain 2>/dev/null | tail -1)
        [ -n "$line" ] || line=null
        echo "{\"case\": \"$tag\", \"round\": $r, \"variant\": \"$name\", \"row\": $line}" >> "$out"
        python3 -c "
import json, sys
r = json.loads(sys.argv[1])
if not r: print('$tag $r $name: no result'); sys.exit()
f = r['first']
print('$tag', $r, '$name', 'first', f['GBps'], 'read_ms', f['read_ms'], 'second', r['second']['GBps'])" "$line"
        sleep 1
    done
done
python3 - "$out" "$tag" "${variants[@]%%=*}" <<'PY'
import json, statistics, sys
path, tag, names = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [json.loads(l) for l in open(path)]
got = {}
for r in rows:
    if r["case"] == tag and r["row"]:
        got.setdefault(r["variant"], {})[r["round"]] = r["row"]["first"]["GBps"]
for v in names:
    xs = list(got.get(v, {}).values())
    if not xs:
        print(f"{tag} {v}: no loads")
        continue
    base = got.get(names[0], {})
    led = sum(1 for k, x in got[v].items() if k in base and x > base[k])
    print(f"{tag} {v}: first loads {statistics.median(xs):.2f} GB/s median ({min(xs):.2f}-{max(xs):.2f}), "
          f"{len(xs)} rounds" + (f", ahead of {names[0]} in {led}" if v != names[0] else ""))
PY
