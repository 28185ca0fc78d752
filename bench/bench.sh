#!/usr/bin/env bash
# bench/bench.sh - end-to-end benchmark of zaya.c on a full-size checkpoint (not part of `make test`).
#
#   bench/bench.sh [CKPT] [--out DIR] [--dtype int8|bf16|both] [--threads "1 2"] [--reuse]
#
# CKPT (default /work/big/zaya1-8b-native) is a hub-format folder, e.g. written by
# bench/make_checkpoint.py. For each dtype it
#   (a) exports CKPT with `python3 export_weights.py CKPT OUT/zaya-DTYPE.bin --dtype DTYPE`
#       (wall time and peak RSS from /usr/bin/time -v; --reuse keeps an existing blob),
#   (b) measures memory read bandwidth at each thread count (bench/bandwidth.c),
#   (c) runs `ZAYA OUT.bin --ids <128 ids> -n 64 -t 0 --threads N --print-ids` for each N and parses
#       the engine's stderr report (`load: S s`, `prefill: N tokens in S s (T tok/s)`,
#       `decode: N tokens in S s (T tok/s)`) and peak RSS,
#   (d) computes the weight bytes read per decoded token from the blob's tensor directory
#       (bench/bytes_per_token.py), the ceiling = bandwidth / bytes per token and decode / ceiling,
#   (e) prints a markdown table (also saved to OUT/results-DTYPE.md) next to the llama.cpp peer numbers.
#
# Environment: ZAYA=path of the engine (default ./zaya_omp if built with `make omp`, else ./zaya),
# PYTHON (python3), CC (cc). PEER_BENCH=path of llama.cpp's llama-bench and PEER_MODEL=a Q8_0 GGUF of
# the same checkpoint: the int8 runs are then each followed, in the same window, by
# `llama-bench -m PEER_MODEL -p NPROMPT -n NGEN -t N -r 3 -mmp 0` and the table shows both; without
# them the table quotes the issue's llama.cpp figures (another machine of this class). Needs /usr/bin/time (GNU time). Run from anywhere; paths are resolved
# against the repository root.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CKPT=/work/big/zaya1-8b-native
OUT=/work/big/bench
DTYPES="int8"
THREADS="1 2"
REUSE=0
NGEN=64
NPROMPT=128
PYTHON="${PYTHON:-python3}"
CC="${CC:-cc}"

die() { echo "bench.sh: error: $*" >&2; exit 1; }
note() { echo "bench.sh: $*" >&2; }

usage() {
    sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

CKPT_SET=0
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage 0 ;;
        --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT="$2"; shift 2 ;;
        --dtype) [ $# -ge 2 ] || die "--dtype needs int8, bf16 or both"; DTYPES="$2"; shift 2 ;;
        --threads) [ $# -ge 2 ] || die "--threads needs a list"; THREADS="$2"; shift 2 ;;
        --reuse) REUSE=1; shift ;;
        -n) [ $# -ge 2 ] || die "-n needs a number"; NGEN="$2"; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ "$CKPT_SET" = 0 ] || die "more than one checkpoint given"; CKPT="$1"; CKPT_SET=1; shift ;;
    esac
done
case "$DTYPES" in
    int8|bf16) ;;
    both) DTYPES="int8 bf16" ;;
    *) die "--dtype must be int8, bf16 or both (got $DTYPES)" ;;
esac
for t in $THREADS; do [[ "$t" =~ ^[1-9][0-9]*$ ]] || die "bad thread count '$t'"; done

# ---------------------------------------------------------------- preconditions, with clear errors
[ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) is missing: apt-get install time"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
command -v "$CC" >/dev/null || die "C compiler $CC not found"
[ -f "$REPO/export_weights.py" ] || die "$REPO/export_weights.py is missing"
if [ -z "${ZAYA:-}" ]; then
    if [ -x "$REPO/zaya_omp" ]; then ZAYA="$REPO/zaya_omp"
    elif [ -x "$REPO/zaya" ]; then ZAYA="$REPO/zaya"
    else die "no engine: build it first (cd $REPO && make && make omp) or set ZAYA=/path/to/zaya"
    fi
fi
[ -x "$ZAYA" ] || die "engine $ZAYA is missing or not executable (cd $REPO && make omp)"
PEER=0
if [ -n "${PEER_BENCH:-}${PEER_MODEL:-}" ]; then
    [ -x "${PEER_BENCH:-}" ] || die "PEER_BENCH='${PEER_BENCH:-}' is not an executable llama-bench"
    [ -s "${PEER_MODEL:-}" ] || die "PEER_MODEL='${PEER_MODEL:-}' is not a GGUF file (set both PEER_BENCH and PEER_MODEL)"
    PEER=1
fi
if ! ldd "$ZAYA" 2>/dev/null | grep -q 'libgomp\|libomp'; then
    note "warning: $ZAYA is not built with OpenMP: --threads is ignored, every row runs on 1 thread" \
         "(build ./zaya_omp with 'make omp')"
fi
[ -d "$CKPT" ] || die "checkpoint folder $CKPT not found (make one: $PYTHON bench/make_checkpoint.py $CKPT)"
[ -f "$CKPT/config.json" ] || die "$CKPT has no config.json"
ls "$CKPT"/*.safetensors >/dev/null 2>&1 || die "$CKPT has no .safetensors files"
case "$(realpath -m "$OUT")/" in "$REPO"/*) die "--out $OUT is inside the repository; blobs must stay out of it" ;; esac
mkdir -p "$OUT" || die "cannot create $OUT"

# ---------------------------------------------------------------- helpers
# field NAME FILE: value of "NAME: value" in a GNU time -v report
time_field() { sed -n "s/^[[:space:]]*$1: *//p" "$2" | tail -1; }
wall_seconds() {   # h:mm:ss or m:ss.ss -> seconds
    awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.1f", s }' <<<"$1"
}
rss_gb() { awk '{ printf "%.2f", $1 / 1048576 }' <<<"$1"; }   # KB -> GiB

# 128 prompt ids: BOS then a fixed pseudo-random sequence of ordinary token ids (LCG, reproducible)
IDS="$(awk -v n="$NPROMPT" 'BEGIN { x = 12345; s = "2";
    for (i = 1; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; s = s "," (300 + x % 200000) }
    print s }')"

LOAD="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
# other processes on a 2-core machine ruin the 2-thread numbers (OpenMP threads wait on a busy core)
# (ps %cpu = cpu time / lifetime of each process; anything above 20% that is not us or this
# pipeline's own ps/awk/head counts)
busy_list() {
    ps -eo pcpu=,pid=,comm= --sort=-pcpu 2>/dev/null \
        | awk -v me=$$ '$1 > 20 && $2 != me && $3 !~ /^(ps|awk|head)$/ { printf " %s(%s%%)", $3, $1 }' | head -c 200
}
BUSY0="$(busy_list)"
[ -z "$BUSY0" ] || note "warning: the machine is busy:$BUSY0 — bandwidth and speed will be low"
CPU="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)"
NCPU="$(nproc 2>/dev/null || echo '?')"
MEM="$(awk '/MemTotal/ { printf "%.0f GB", $2 / 1048576 }' /proc/meminfo 2>/dev/null)"
COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# ---------------------------------------------------------------- (b) bandwidth
BW_BIN="$OUT/bandwidth"
"$CC" -O3 -march=native -pthread -std=c11 -o "$BW_BIN" "$REPO/bench/bandwidth.c" \
    || die "cannot build bench/bandwidth.c"
TLIST="$(tr ' ' ',' <<<"$THREADS")"
note "bandwidth (threads $TLIST, 2 GB buffer, best of 7) ..."
BW_OUT="$("$BW_BIN" -t "$TLIST")" || die "bandwidth failed"
echo "$BW_OUT" >&2
declare -A BW
for t in $THREADS; do
    BW[$t]="$(sed -n "s/^bandwidth threads=$t GB\/s=\([0-9.]*\).*/\1/p" <<<"$BW_OUT")"
    [ -n "${BW[$t]}" ] || die "no bandwidth line for $t threads"
done

# ---------------------------------------------------------------- per dtype
for DT in $DTYPES; do
    BLOB="$OUT/zaya-$DT.bin"
    # (a) export
    EXP_WALL="reused"; EXP_RSS="-"
    if [ "$REUSE" = 1 ] && [ -s "$BLOB" ]; then
        note "reusing $BLOB"
    else
        note "export $CKPT -> $BLOB (--dtype $DT) ..."
        rm -f "$BLOB"
        if ! /usr/bin/time -v -o "$OUT/export-$DT.time" \
                "$PYTHON" "$REPO/export_weights.py" "$CKPT" "$BLOB" --dtype "$DT" >"$OUT/export-$DT.log" 2>&1; then
            tail -20 "$OUT/export-$DT.log" >&2
            die "export_weights.py failed (log: $OUT/export-$DT.log)"
        fi
        EXP_WALL="$(wall_seconds "$(time_field 'Elapsed (wall clock) time (h:mm:ss or m:ss)' "$OUT/export-$DT.time")") s"
        EXP_RSS="$(rss_gb "$(time_field 'Maximum resident set size (kbytes)' "$OUT/export-$DT.time")") GiB"
        note "export: $EXP_WALL, peak RSS $EXP_RSS"
    fi
    [ -s "$BLOB" ] || die "blob $BLOB is missing or empty"
    BLOB_GB="$(awk '{ printf "%.2f", $1 / 1e9 }' <<<"$(stat -L -c %s "$BLOB")")"

    # (d) bytes per decoded token, from the blob's tensor directory
    BPT_LINE="$("$PYTHON" "$REPO/bench/bytes_per_token.py" "$BLOB" -v 2>"$OUT/bytes-$DT.md")" \
        || die "bytes_per_token.py failed on $BLOB"
    BPT="$(sed -n 's/.* total=\([0-9]*\) .*/\1/p' <<<"$BPT_LINE")"
    [ -n "$BPT" ] || die "cannot parse: $BPT_LINE"

    # warm the page cache: read the whole blob once (a run after an export or after other big files
    # went through the cache would otherwise time the disk), then one short engine run
    note "warm-up: reading the blob into the page cache, one short run ..."
    cat "$BLOB" >/dev/null || die "cannot read $BLOB"
    "$ZAYA" "$BLOB" --ids 2 -n 1 -t 0 --print-ids >/dev/null 2>"$OUT/warmup-$DT.log" || {
        tail -5 "$OUT/warmup-$DT.log" >&2; die "$ZAYA failed on $BLOB (log: $OUT/warmup-$DT.log)"; }

    # (c) the runs
    declare -A PRE DEC LOADS RSS RUNBUSY PEER_PRE PEER_DEC
    for t in $THREADS; do
        note "run: $DT, $t thread(s), prompt $NPROMPT ids, $NGEN greedy tokens ..."
        RUNBUSY[$t]="$(busy_list)"
        [ -z "${RUNBUSY[$t]}" ] || note "warning: the machine is busy:${RUNBUSY[$t]} — these numbers will be low"
        ERR="$OUT/run-$DT-t$t.err"
        # shellcheck disable=SC2086   # ZAYA_FLAGS is a list of flags
        if ! /usr/bin/time -v -o "$OUT/run-$DT-t$t.time" "$ZAYA" "$BLOB" --ids "$IDS" -n "$NGEN" -t 0 \
                --threads "$t" --print-ids ${ZAYA_FLAGS---hugepages} >"$OUT/run-$DT-t$t.out" 2>"$ERR"; then
            tail -5 "$ERR" >&2; die "$ZAYA failed ($ERR)"
        fi
        LOADS[$t]="$(sed -n 's/^load: \([0-9.]*\) s.*/\1/p' "$ERR" | tail -1)"
        PRE[$t]="$(sed -n 's/^prefill: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$ERR" | tail -1)"
        DEC[$t]="$(sed -n 's/^decode: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$ERR" | tail -1)"
        RSS[$t]="$(rss_gb "$(time_field 'Maximum resident set size (kbytes)' "$OUT/run-$DT-t$t.time")")"
        [ -n "${LOADS[$t]}" ] || die "no 'load: S s' line from $ZAYA in $ERR"
        [ -n "${PRE[$t]}" ] || die "no 'prefill: N tokens in S s (T tok/s)' line from $ZAYA in $ERR"
        [ -n "${DEC[$t]}" ] || die "no 'decode: N tokens in S s (T tok/s)' line from $ZAYA in $ERR"
        note "  load ${LOADS[$t]} s, prefill ${PRE[$t]} tok/s, decode ${DEC[$t]} tok/s, peak RSS ${RSS[$t]} GiB"
        if [ "$PEER" = 1 ] && [ "$DT" = int8 ]; then
            note "peer: llama-bench, $t thread(s), pp$NPROMPT + tg$NGEN, 3 repetitions ..."
            if ! "$PEER_BENCH" -m "$PEER_MODEL" -p "$NPROMPT" -n "$NGEN" -t "$t" -r 3 -mmp 0 -o csv \
                    >"$OUT/peer-t$t.csv" 2>"$OUT/peer-t$t.err"; then
                tail -5 "$OUT/peer-t$t.err" >&2; die "llama-bench failed ($OUT/peer-t$t.err)"
            fi
            # avg_ts of the row with n_gen = 0 (prompt processing) and the one with n_prompt = 0 (generation)
            read -r PEER_PRE[$t] PEER_DEC[$t] < <("$PYTHON" -c '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
pp = [r["avg_ts"] for r in rows if r["n_gen"] == "0"]
tg = [r["avg_ts"] for r in rows if r["n_prompt"] == "0"]
print("%.2f %.2f" % (float(pp[0]), float(tg[0])) if pp and tg else "- -")' "$OUT/peer-t$t.csv")
            [ "${PEER_PRE[$t]}" != "-" ] || die "cannot read avg_ts from $OUT/peer-t$t.csv"
            note "  llama.cpp: pp$NPROMPT ${PEER_PRE[$t]} tok/s, tg$NGEN ${PEER_DEC[$t]} tok/s"
        fi
    done

    # (e) the table
    RES="$OUT/results-$DT.md"
    {
        echo "### zaya.c $COMMIT, $DT blob ($BLOB_GB GB), $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        echo "Machine: $CPU, $NCPU cpus, $MEM; load average at the start $LOAD; busy processes during the"
        echo "bandwidth measurement: ${BUSY0:-none}. Rows with other busy processes are not valid measurements."
        echo "Checkpoint: $CKPT. Prompt $NPROMPT ids, $NGEN greedy tokens. Export: $EXP_WALL, peak RSS $EXP_RSS."
        echo "Bytes read per decoded token: $(awk -v b="$BPT" 'BEGIN { printf "%.3f GB", b / 1e9 }') (weights:"
        echo "attention + router + norms of every layer, one expert per layer, the whole LM head; KV cache excluded)."
        echo
        if [ "$PEER" = 1 ] && [ "$DT" = int8 ]; then
            echo "llama.cpp: measured right after each zaya.c run by llama-bench on $PEER_MODEL"
            echo "($(stat -L -c %s "$PEER_MODEL") bytes); its tg$NGEN starts from an empty context, ours after the $NPROMPT-id prompt."
        else
            echo "llama.cpp: the issue's figures (Q8_0, ZAYA port of PR #23112, another AMD EPYC Zen 4 2-vCPU machine),"
            echo "not measured in this run (set PEER_BENCH and PEER_MODEL to measure it)."
        fi
        echo
        echo "| threads | prefill tok/s | decode tok/s | load s | peak RSS GiB | read GB/s | ceiling tok/s | decode / ceiling | llama.cpp decode | llama.cpp pp$NPROMPT | other busy processes |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for t in $THREADS; do
            if [ -n "${PEER_DEC[$t]:-}" ]; then PEER_D="${PEER_DEC[$t]}"; PEER_P="${PEER_PRE[$t]}"
            else case "$t" in 1) PEER_D="13.3-13.7"; PEER_P="35" ;; 2) PEER_D="17.2-17.5"; PEER_P="55-67" ;; *) PEER_D="-"; PEER_P="-" ;; esac
            fi
            awk -v t="$t" -v p="${PRE[$t]}" -v d="${DEC[$t]}" -v l="${LOADS[$t]}" -v r="${RSS[$t]}" \
                -v bw="${BW[$t]}" -v b="$BPT" -v pd="$PEER_D" -v pp="$PEER_P" -v la="${RUNBUSY[$t]:-none}" 'BEGIN {
                c = bw * 1e9 / b
                printf "| %d | %.2f | %.2f | %.2f | %s | %.2f | %.2f | %.2f | %s | %s | %s |\n", t, p, d, l, r, bw, c, d / c, pd, pp, la }'
        done
        echo
        echo "Bytes per token by part:"
        echo
        cat "$OUT/bytes-$DT.md"
    } | tee "$RES"
    note "saved $RES"
    unset PRE DEC LOADS RSS RUNBUSY PEER_PRE PEER_DEC
done
