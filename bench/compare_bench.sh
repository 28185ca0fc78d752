#!/usr/bin/env bash
# bench/compare_bench.sh WORK [N_TOKENS]: compare.py's three views timed on a full-width ZAYA1-8B-shaped model
# (2 layers, hidden 2048, 16 experts, the 262272-token vocabulary; int8 blob) over N_TOKENS prompt ids.
#   WORK        a folder outside the repository (checkpoint 1.9 GB, blob 1 GB, three dumps of ~0.7 GB at 512 ids)
#   COMPARE=F   the compare.py to time (default compare.py; e.g. an older revision's copy beside it)
#   PY=P        its interpreter (default: the first of python3, /usr/bin/python3 with numpy, as the Makefile)
#   VIEWS=...   which views to time (default "plain envelope local-bf16"; local-bf16-layers: the port's dump
#               without model.norm and logits, whose replays skip the LM head)
# Prints one line per view: seconds, peak resident MB, exit status (1 is expected for the plain view:
# a bf16 run is not an fp32 run). The ./zaya replays of --local --bf16 are inside its time.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:?usage: bench/compare_bench.sh WORK [N_TOKENS]}
N=${2:-512}
COMPARE=${COMPARE:-compare.py}
if [ -z "${PY:-}" ]; then
    for PY in python3 /usr/bin/python3; do "$PY" -c 'import numpy' 2>/dev/null && break; done
fi
mkdir -p "$WORK"
[ -f "$WORK/ckpt/config.json" ] && [ -f "$WORK/ckpt/model-00001-of-00001.safetensors" ] ||
    python3 tools/make_checkpoint.py "$WORK/ckpt" --layers 2 --force --quiet
[ -f "$WORK/model_int8.bin" ] || python3 export_weights.py "$WORK/ckpt" "$WORK/model_int8.bin" --dtype int8 > /dev/null
IDS=$(python3 -c "import random; r = random.Random(43); print(','.join(['2'] + [str(r.randrange(3, 262000)) for _ in range($N - 1)]))")
for p in fp32 bf16 bf16-torch1.13; do
    d="$WORK/d${N}_$p"
    [ -f "$d/index.json" ] || ./zaya "$WORK/model_int8.bin" --ids "$IDS" -n 0 --precision $p --dump "$d" > /dev/null 2>&1
done
F="$WORK/d${N}_fp32" E="$WORK/d${N}_bf16" P="$WORK/d${N}_bf16-torch1.13"
echo "$N ids, $(ls "$F" | wc -l) files and $(du -sm "$F" | cut -f1) MB per dump; $COMPARE with $PY"
timed() {
    local label=$1; shift
    /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$PY" "$COMPARE" "$@" > "$WORK/out_${label}_$N.txt" 2>&1 && rc=0 || rc=$?
    read -r s kb < "$WORK/time.txt"
    printf "%-22s %8.1f s %7d MB  exit %d\n" "$label" "$s" $((kb / 1024)) "$rc"
}
for view in ${VIEWS:-plain envelope local-bf16}; do case $view in
    plain) timed plain "$P" "$F" ;;
    envelope) timed envelope "$P" "$F" --envelope "$E" ;;
    local-bf16) rm -rf "$WORK/replay_${N}"_*
        timed local-bf16 --local "$P" --model "$WORK/model_int8.bin" --bf16 --replay-out "$WORK/replay_$N" ;;
    local-bf16-layers) L="$WORK/d${N}_layers"; rm -rf "$L" "$WORK/replay_${N}"_*; mkdir "$L"   # a porter's layer dump:
        cp -l "$P"/model.layers.* "$P"/model~input_scaled.npy "$L"/                         # no model.norm, no logits
        "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["tensors"] = [t for t in d["tensors"] if t["name"].startswith(("model.layers", "model:input"))]; json.dump(d, open(sys.argv[2], "w"))' "$P/index.json" "$L/index.json"
        timed local-bf16-layers --local "$L" --model "$WORK/model_int8.bin" --bf16 --replay-out "$WORK/replay_$N" ;;
    *) echo "unknown view $view (plain, envelope, local-bf16, local-bf16-layers)" >&2; exit 2 ;;
esac; done
