#!/usr/bin/env bash
# bisect_llama.sh - from a GGUF of llama.cpp's ZAYA port and a prompt to zaya.c's layer-local table.
#
#   LLAMA=LLAMA_CPP_CHECKOUT tools/bisect_llama.sh MODEL.gguf (--ids 2,818,... | --prompt TEXT) [--out DIR]
#       [--blob PORT_WEIGHTS.bin] [--config CKPT_DIR] [--keep-skip] [--kv f32|f16] [--fa off|on] [--threads N]
#       [--map MAP.json] [--commit SHA] [--placement auto|ggml|none]
#
# 1. capture: tools/llama_capture.cpp (built once against $LLAMA: include/, ggml/include/, and the shared
#    libraries in $LLAMA_LIB, default $LLAMA/build/bin) runs the GGUF on the ids and writes the graph tensors
#    the map names (OUT/raw);
# 2. map: zaya_compare.portmap applies maps/llama.cpp-zaya1.json: OUT/port, a zaya.c dump under HF names;
# 3. the port's own weights: --blob, else `export_weights.py MODEL.gguf OUT/port-weights.bin` (the GGUF's
#    tensors as ggml dequantizes them, and its own tokenizer.ggml.* vocabulary and merges; the GGUF alone
#    does. It stores no sliding windows and one RoPE theta, so zaya.c then computes every layer as the
#    port does, full attention with that theta, and says so. --config CKPT_DIR, the checkpoint folder it
#    was converted from, checks the GGUF against its config.json and takes the sliding windows, the
#    sliding layers' RoPE and the tokenizer from it: the exact checkpoint);
#    then, unless --keep-skip, tools/forbid_skip.py: the port never picks the skip class, so neither may
#    the replay (OUT/port-weights-noskip.bin);
# 4. zaya.c on those weights and ids (OUT/zaya: the end-to-end column) and the layer-local replay of
#    OUT/port (compare.py --local --model, fp32 like the port; --verbose lists every mapped tap, agreeing
#    or not). Prints the table and FIRST LOCAL ERROR, then which taps agree in every layer and which steps
#    add error beyond their inputs' (zaya_compare.portmap --steps: a hint where to read the port's code).
#    Exit status that of compare.py (0 agree, 1 a local error, 2 an input error).
# Defaults: f32 KV cache and no flash attention, so that what differs is the port's graph rather than
# llama.cpp's run-time options (--kv f16 / --fa on to see those).
# The layer-local verdicts use the step check (zaya_compare/ggml.py): a product whose output is what the replay's
# arithmetic gives on the port's own input to it is no step that adds error, however its error grew.
# Placement: a GGUF whose matrices are quantized (or F16 / BF16) is replayed, and run end to end, with
# --precision fp32+ggml (ggml_round.h: each product's input rounded as ggml's CPU backend quantizes it for
# the weight's type, Q8_K / Q8_0 / Q8_1 / F16 / BF16), so that ggml's own arithmetic is not reported as
# the port's error; --placement none replays in plain float32, ggml forces it. With --kv f16 (and no flash
# attention) the F16 KV cache too (+ggml-kv-f16); with --fa on ggml's flash attention (+ggml-fa; llama.cpp's own
# default on the CPU is -fa auto = on, with an F16 cache). Not used: +ggml-conv and +ggml-gelu, the port's own choices
# (its F16 grouped conv and tanh GELU), which the bisect is there to name.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "bisect_llama: $1" >&2; [ -n "${2:-}" ] && echo "  hint: $2" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: LLAMA=DIR tools/bisect_llama.sh MODEL.gguf (--ids IDS | --prompt TEXT) [--out DIR] [--blob BIN] [--config DIR] [--keep-skip] [--kv f32|f16] [--fa off|on] [--threads N] [--map MAP] [--commit SHA]"
GGUF="$1"; shift
IDS=""; PROMPT=""; OUT=""; BLOB=""; CONFIG=""; KEEP_SKIP=0; KV=f32; FA=off; THREADS=2; MAP="$HERE/maps/llama.cpp-zaya1.json"; COMMIT=""
PLACEMENT=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --ids) IDS="$2"; shift 2 ;;
        --prompt) PROMPT="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --blob) BLOB="$2"; shift 2 ;;
        --config) CONFIG="$2"; shift 2 ;;
        --keep-skip) KEEP_SKIP=1; shift ;;
        --kv) KV="$2"; shift 2 ;;
        --fa) FA="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --map) MAP="$2"; shift 2 ;;
        --commit) COMMIT="$2"; shift 2 ;;
        --placement) PLACEMENT="$2"; shift 2 ;;
        *) die "unknown argument $1" ;;
    esac
done
[ -f "$GGUF" ] || die "$GGUF: no such GGUF" "a GGUF written by the port's convert_hf_to_gguf.py"
[ -n "$IDS$PROMPT" ] || die "give --ids 2,818,... or --prompt TEXT"
LLAMA="${LLAMA:-}"; [ -n "$LLAMA" ] || die "set LLAMA to a built llama.cpp checkout of the port" "LLAMA=~/llama.cpp (its include/, ggml/include/ and build/bin/libllama.so)"
LLAMA_LIB="${LLAMA_LIB:-$LLAMA/build/bin}"
[ -e "$LLAMA_LIB/libllama.so" ] || die "no libllama.so in $LLAMA_LIB" "build llama.cpp (cmake -B build && cmake --build build --target llama), or set LLAMA_LIB"
OUT="${OUT:-$(basename "$GGUF" .gguf)-bisect}"; mkdir -p "$OUT"
PY="${PY:-}"
if [ -z "$PY" ]; then
    for p in python3 /usr/bin/python3; do "$p" -c "import numpy" 2>/dev/null && { PY="$p"; break; }; done
fi
[ -n "$PY" ] || die "no python3 with numpy" "apt-get install python3-numpy, or PY=/path/to/python3"
[ -x "$HERE/zaya" ] || (cd "$HERE" && make zaya >/dev/null) || die "cannot build ./zaya" "make zaya"

CAP="$HERE/build/llama_capture"
if [ ! -x "$CAP" ] || [ "$HERE/tools/llama_capture.cpp" -nt "$CAP" ]; then
    mkdir -p "$HERE/build"
    echo "+ g++ ... tools/llama_capture.cpp (against $LLAMA)"
    g++ -O2 -std=c++17 -I"$LLAMA/include" -I"$LLAMA/ggml/include" -o "$CAP" "$HERE/tools/llama_capture.cpp" \
        -L"$LLAMA_LIB" -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA_LIB" || die "cannot build tools/llama_capture.cpp against $LLAMA"
fi

if [ -z "$BLOB" ]; then
    BLOB="$OUT/port-weights.bin"
    echo "+ python3 export_weights.py $GGUF $BLOB${CONFIG:+ --tokenizer $CONFIG}"
    (cd "$HERE" && python3 export_weights.py "$GGUF" "$BLOB" ${CONFIG:+--tokenizer "$CONFIG"}) > "$OUT/export.log" 2>&1 \
        || { tail -5 "$OUT/export.log" >&2
             if [ -n "$CONFIG" ]; then die "export_weights.py could not read $GGUF with --config $CONFIG (log: $OUT/export.log)" \
                 "--config DIR must be the checkpoint folder the GGUF was converted from (config.json, tokenizer.json), or leave it out to use the GGUF alone"
             else die "export_weights.py could not read $GGUF (log: $OUT/export.log)" \
                 "--config CKPT_DIR, the checkpoint folder the GGUF was converted from, supplies what the GGUF lacks (its tokenizer, the sliding windows)"; fi; }
    # what the GGUF could not say, and where the tokenizer came from
    grep '^note: ' "$OUT/export.log" || true
    [ -n "$CONFIG" ] || echo "note: from the GGUF alone zaya.c computes every layer as the port does (no sliding window, one RoPE" \
        "theta): a port that leaves out the checkpoint's sliding windows or the sliding layers' RoPE agrees here; --config" \
        "CKPT_DIR (the checkpoint it was converted from) judges it against the checkpoint's"
fi
# the ggml placement: the GGUF's matrix types (2-D and 3-D tensors; the grouped conv is not a product here)
case "$PLACEMENT" in auto|ggml|none) ;; *) die "--placement $PLACEMENT: expected auto, ggml or none" ;; esac
PREC_GGML=""
if [ "$PLACEMENT" != none ]; then
    QTYPES="$(cd "$HERE" && "$PY" -c "import sys, gguf
g = gguf.GGUFFile(sys.argv[1])
print(' '.join(sorted({t.type for n, t in g.tensors.items() if len(t.ne) >= 2 and t.type != 'F32'
                       and 'cca_conv_grp' not in n and 'ssm_conv1d' not in n})))" "$GGUF")" || die "cannot read $GGUF"
    if [ -n "$QTYPES" ] || [ "$PLACEMENT" = ggml ]; then
        PREC_GGML="fp32+ggml"
        echo "placement: the GGUF's matrices are ${QTYPES:-F32}: zaya.c computes as ggml's CPU backend does" \
             "(--precision fp32+ggml: each product's input quantized per its weight's vec_dot_type; --placement none to" \
             "replay in plain float32)"
    else
        echo "placement: the GGUF's matrices are F32: plain float32 replay (ggml rounds no product's input)"
    fi
    if [ "$KV" = f16 ] && [ "$FA" = off ]; then
        PREC_GGML="${PREC_GGML:-fp32}+ggml-kv-f16"
        echo "placement: --kv f16 without flash attention: keys, values, query and probabilities in F16 (+ggml-kv-f16)"
    fi
    if [ "$FA" = on ]; then
        PREC_GGML="${PREC_GGML:-fp32}+ggml-fa"
        echo "placement: --fa on: attention as ggml-cpu's flash attention (+ggml-fa: keys, values and query in F16, online" \
             "softmax, the values accumulated in F16; its one-chunk path, a batch of fewer than 64 positions)"
    fi
fi
if [ "$KEEP_SKIP" = 0 ]; then
    echo "+ python3 tools/forbid_skip.py $BLOB $OUT/port-weights-noskip.bin   (the port never picks the skip class)"
    python3 "$HERE/tools/forbid_skip.py" "$BLOB" "$OUT/port-weights-noskip.bin" > "$OUT/forbid_skip.log" || die "forbid_skip.py failed"
    BLOB="$OUT/port-weights-noskip.bin"
fi
if [ -n "$PROMPT" ]; then
    # like ./zaya -i: the tokenizer's prefix (<bos>) and the text, without the suffix its post-processor appends
    FULL="$(printf '%s' "$PROMPT" | "$HERE/zaya" "$BLOB" --encode)" || die "./zaya $BLOB --encode failed" \
        "give the ids as --ids 2,818,..., or --config CKPT_DIR for the checkpoint's tokenizer"
    EMPTY="$(printf '' | "$HERE/zaya" "$BLOB" --encode)"
    IDS="$("$PY" -c "import sys
f, e = [list(map(int, s.replace(',', ' ').split())) for s in sys.argv[1:3]]
n = 0
while n < len(e) and n < len(f) and e[n] == f[n]: n += 1
suffix = e[n:]
print(','.join(map(str, f[:len(f) - len(suffix)] if suffix and f[-len(suffix):] == suffix else f)))" "$FULL" "$EMPTY")"
fi
if [ -z "$COMMIT" ]; then
    COMMIT="$(git -C "$LLAMA" rev-parse HEAD 2>/dev/null || "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['port'].get('commit','unknown'))" "$MAP")"
fi
echo "ids: $IDS"

RE="$(cd "$HERE" && "$PY" -m zaya_compare.portmap "$MAP" --regex)"
echo "+ llama_capture $GGUF --ids ... --out $OUT/raw --kv $KV --fa $FA"
"$CAP" "$GGUF" --ids "$IDS" --out "$OUT/raw" --re "$RE" --commit "$COMMIT" --kv "$KV" --fa "$FA" --threads "$THREADS" \
    > "$OUT/capture.log" 2>&1 || { tail -5 "$OUT/capture.log" >&2; die "the capture failed (log: $OUT/capture.log)"; }
tail -1 "$OUT/capture.log"
echo "+ python3 -m zaya_compare.portmap $MAP $OUT/raw $OUT/port"
(cd "$HERE" && "$PY" -m zaya_compare.portmap "$MAP" "$OUT/raw" "$OUT/port" --verbose)
echo "+ ./zaya $BLOB --ids ... --dump $OUT/zaya"
rm -rf "$OUT/zaya"
"$HERE/zaya" "$BLOB" --ids "$IDS" -n 0 ${PREC_GGML:+--precision $PREC_GGML} --dump "$OUT/zaya" > "$OUT/zaya.log" 2>&1 || { tail -3 "$OUT/zaya.log" >&2; die "./zaya failed"; }
PREC=""; [ "$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('precision','fp32'))" "$MAP")" = bf16 ] && PREC="--bf16"
echo "+ python3 compare.py --local $OUT/port --model $BLOB --reference $OUT/zaya --verbose $PREC${PREC_GGML:+ --precision $PREC_GGML}"
set +e
"$PY" "$HERE/compare.py" --local "$OUT/port" --model "$BLOB" --replay-out "$OUT/replay" --reference "$OUT/zaya" --verbose $PREC \
    ${PREC_GGML:+--precision $PREC_GGML} | tee "$OUT/local.txt"
rc=${PIPESTATUS[0]}
set -e
(cd "$HERE" && "$PY" -m zaya_compare.portmap --steps "$OUT/local.txt") | tee -a "$OUT/local.txt"
(cd "$HERE" && "$PY" -m zaya_compare.portmap --globals "$OUT/port" "$OUT/zaya") | tee -a "$OUT/local.txt" || rc=1
if [ -f "$OUT/port/approximate/index.json" ]; then
    (cd "$HERE" && "$PY" -m zaya_compare.portmap --approximate "$OUT/port/approximate" "$OUT/replay_fp32")
fi
exit "$rc"
