#!/usr/bin/env bash
# bench/bench.sh - end-to-end benchmark of zaya.c on a full-size checkpoint (not part of `make test`).
#
#   bench/bench.sh [CKPT] [--out DIR] [--dtype int8|bf16|both] [--threads "1 2"] [--rounds 3] [--reuse] [-n 64]
#   bench/bench.sh [CKPT] --contention [--threads "1 2"] [--rounds 5] ...
#
# CKPT (default /work/big/zaya1-8b-native) is a hub-format folder, e.g. written by
# tools/make_checkpoint.py. For each dtype it
#   (a) exports CKPT with `python3 export_weights.py CKPT OUT/zaya-DTYPE.bin --dtype DTYPE`
#       (wall time and peak RSS from /usr/bin/time -v; --reuse keeps an existing blob),
#   (b)+(c) for each thread count N, ROUNDS times (--rounds, default 3): measures the memory read
#       bandwidth at N threads (bench/bandwidth.c, best of 3 passes), then runs `ZAYA OUT.bin --ids
#       <128 ids> -n 64 -t 0 --threads N --print-ids` and parses the engine's stderr report (`load: S s`,
#       `prefill: N tokens in S s (T tok/s)`, `decode: N tokens in S s (T tok/s)`) and peak RSS; one
#       more bandwidth measurement closes the window, so every run has one just before and after it;
#       then the paired measurement (bench/decode_vs_read.c): NGEN decode steps, each followed by a
#       plain read of the weight bytes it reads, in one process (the ratio that host drift cannot skew),
#   (d) computes the weight bytes read per decoded token from the blob's tensor directory
#       (bench/bytes_per_token.py), the ceiling = bandwidth / bytes per token and decode / ceiling,
#   (e) prints a markdown table (also saved to OUT/results-DTYPE.md) next to the llama.cpp peer numbers.
#
# --contention: instead of (b)-(e), decode and prefill at each thread count with and without one busy
#   competitor process (`sh -c 'while :; do :; done'`, started and stopped by this script around each
#   run), alternating quiet and busy runs and the thread counts, ROUNDS times: a table of medians and
#   ranges (also saved to OUT/contention-DTYPE.md) and each count's busy decode over 1 thread's.
# Environment: ZAYA=path of the engine (default ./zaya),
# PYTHON (python3), CC (cc). PEER_BENCH=path of llama.cpp's llama-bench and PEER_MODEL=a Q8_0 GGUF of
# the same checkpoint: the int8 runs at each thread count are then followed, in the same window, by
# `llama-bench -m PEER_MODEL -p NPROMPT -n NGEN -d 0,NPROMPT -t N -r 3 -mmp 0` (its pp at depth 0, its
# tg after NPROMPT positions like ours; without -d in that llama-bench, tg from an empty context)
# and the table shows both; without them the table quotes the issue's llama.cpp figures (another
# machine of this class). Needs /usr/bin/time (GNU time). Run from anywhere; paths are resolved
# against the repository root.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CKPT=/work/big/zaya1-8b-native
OUT=/work/big/bench
DTYPES="int8"
THREADS="1 2"
REUSE=0
CONTENTION=0
NGEN=64
ROUNDS=3
NPROMPT=128
PYTHON="${PYTHON:-python3}"
CC="${CC:-cc}"

die() { echo "bench.sh: error: $*" >&2; exit 1; }
note() { echo "bench.sh: $*" >&2; }

usage() {
    sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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
        --contention) CONTENTION=1; shift ;;
        -n) [ $# -ge 2 ] || die "-n needs a number"; NGEN="$2"; shift 2 ;;
        --rounds) [ $# -ge 2 ] || die "--rounds needs a number"; ROUNDS="$2"; shift 2 ;;
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
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive number (got $ROUNDS)"
[[ "$NGEN" =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive number (got $NGEN)"

# ---------------------------------------------------------------- preconditions, with clear errors
[ "$CONTENTION" = 1 ] || [ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) is missing: apt-get install time"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
command -v "$CC" >/dev/null || die "C compiler $CC not found"
[ -f "$REPO/export_weights.py" ] || die "$REPO/export_weights.py is missing"
ZAYA="${ZAYA:-$REPO/zaya}"
[ -x "$ZAYA" ] || die "engine $ZAYA is missing or not executable (cd $REPO && make)"
PEER=0
if [ -n "${PEER_BENCH:-}${PEER_MODEL:-}" ]; then
    [ -x "${PEER_BENCH:-}" ] || die "PEER_BENCH='${PEER_BENCH:-}' is not an executable llama-bench"
    [ -s "${PEER_MODEL:-}" ] || die "PEER_MODEL='${PEER_MODEL:-}' is not a GGUF file (set both PEER_BENCH and PEER_MODEL)"
    PEER=1
    # llama-bench -d 0,N: its generation also after N positions of context, as ours runs after the prompt
    PEER_DEPTH=0 PEER_DEPTH_ARGS=()
    PEER_HELP="$("$PEER_BENCH" --help 2>&1 || true)"   # (not piped into grep -q: it can die of SIGPIPE under pipefail)
    if grep -q -- '--n-depth' <<<"$PEER_HELP"; then PEER_DEPTH="$NPROMPT" PEER_DEPTH_ARGS=(-d "0,$NPROMPT"); fi
fi
[ -d "$CKPT" ] || die "checkpoint folder $CKPT not found (make one: $PYTHON tools/make_checkpoint.py $CKPT)"
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
# other processes on a 2-core machine make the 2-thread numbers low (--contention measures how much)
# (ps %cpu = cpu time / lifetime of each process; anything above 20% that is not us counts)
busy_list() {   # (processes younger than 2 s, such as this subshell, show a meaningless %cpu)
    ps -eo pcpu=,etimes=,pid=,comm= --sort=-pcpu 2>/dev/null \
        | awk -v me=$$ '$1 > 20 && $2 >= 2 && $3 != me { printf " %s(%s%%)", $4, $1 }' | head -c 200
}
BUSY0="$(busy_list)"
[ -z "$BUSY0" ] || note "warning: the machine is busy:$BUSY0 — bandwidth and speed will be low"
CPU="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)"
NCPU="$(nproc 2>/dev/null || echo '?')"
MEM="$(awk '/MemTotal/ { printf "%.0f GB", $2 / 1048576 }' /proc/meminfo 2>/dev/null)"
COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# ---------------------------------------------------------------- (b) bandwidth
# measured in the window of the runs (see (c)): this host's bandwidth drifts by 30% within minutes
BW_BIN="$OUT/bandwidth"
"$CC" -O3 -march=native -pthread -std=c11 -o "$BW_BIN" "$REPO/bench/bandwidth.c" \
    || die "cannot build bench/bandwidth.c"
bw_now() {   # read bandwidth at $1 threads now: best of 3 passes over a 2 GiB buffer, GB/s
    local out gbs
    out="$("$BW_BIN" -t "$1" -r 3)" || die "bandwidth failed"
    gbs="$(sed -n "s/^bandwidth threads=$1 GB\/s=\([0-9.]*\).*/\1/p" <<<"$out")"
    [ -n "$gbs" ] || die "no bandwidth line for $1 threads in: $out"
    echo "$gbs"
}

# the paired measurement (decode steps alternating with plain reads of the same weight bytes)
DVR_BIN="$REPO/build/decode_vs_read"
make -s -C "$REPO" CC="$CC" build/decode_vs_read >&2 || die "cannot build bench/decode_vs_read.c (make build/decode_vs_read)"
case " ${ZAYA_FLAGS-} " in *" --hugepages "*) DVR_FLAGS="--hugepages" ;; *) DVR_FLAGS="" ;; esac

# ---------------------------------------------------------------- --contention
# one run: prints "prefill_tok/s decode_tok/s" of `ZAYA BLOB` at $2 threads; $3 = busy: with a competitor
one_run() {
    local blob="$1" t="$2" busy="$3" err="$OUT/contention-run.err" hog="" P D
    if [ "$busy" = busy ]; then sh -c 'while :; do :; done' & hog=$!; sleep 0.2; fi
    # shellcheck disable=SC2086   # ZAYA_FLAGS is a list of flags
    "$ZAYA" "$blob" --ids "$IDS" -n "$NGEN" -t 0 --threads "$t" --print-ids ${ZAYA_FLAGS-} >/dev/null 2>"$err" \
        || { [ -z "$hog" ] || kill "$hog"; tail -5 "$err" >&2; die "$ZAYA failed ($err)"; }
    [ -z "$hog" ] || { kill "$hog"; wait "$hog" 2>/dev/null || true; }
    P="$(sed -n 's/^prefill: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$err" | tail -1)"
    D="$(sed -n 's/^decode: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$err" | tail -1)"
    [ -n "$P" ] && [ -n "$D" ] || die "no prefill/decode lines from $ZAYA in $err"
    echo "$P $D"
}
stats() {   # median (min-max) of the numbers on stdin
    sort -g | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'
}
contention() {
    local dt="$1" blob="$2" t c r res="$OUT/contention-$1.md" key
    declare -A CP CD
    for r in $(seq "$ROUNDS"); do
        for t in $THREADS; do
            for c in quiet busy; do
                note "contention round $r/$ROUNDS: $t thread(s), $c ..."
                read -r P D < <(one_run "$blob" "$t" "$c")
                CP[$t,$c]+="$P "; CD[$t,$c]+="$D "
                note "  prefill $P tok/s, decode $D tok/s"
            done
        done
    done
    {
        echo "### zaya.c $COMMIT, $dt blob, contention, $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        echo "Machine: $CPU, $NCPU cpus, $MEM. Prompt $NPROMPT ids, $NGEN greedy tokens, $ROUNDS rounds; busy = one"
        echo "competitor process spinning on a core for the whole run. Median (min-max) over the rounds."
        echo
        echo "| threads | condition | prefill tok/s | decode tok/s | decode / 1 thread's, same condition (medians) |"
        echo "| ---: | --- | ---: | ---: | ---: |"
        local first="${THREADS%% *}"
        for t in $THREADS; do
            for c in quiet busy; do
                key="$t,$c"
                echo "| $t | $c | $(tr ' ' '\n' <<<"${CP[$key]}" | grep . | stats) | $(tr ' ' '\n' <<<"${CD[$key]}" | grep . | stats) |" \
                     "$(awk -v a="$(tr ' ' '\n' <<<"${CD[$key]}" | grep . | stats | cut -d' ' -f1)" \
                            -v b="$(tr ' ' '\n' <<<"${CD[$first,$c]}" | grep . | stats | cut -d' ' -f1)" 'BEGIN { printf "%.2f", a / b }') |"
            done
        done
        echo
        for t in $THREADS; do for c in quiet busy; do echo "Runs at $t thread(s), $c, in order: decode ${CD[$t,$c]}; prefill ${CP[$t,$c]}."; done; done
    } | tee "$res"
    note "saved $res"
}

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

    if [ "$CONTENTION" = 1 ]; then contention "$DT" "$BLOB"; continue; fi

    # (c) the runs
    declare -A PRE DEC DECS LOADS RSS RUNBUSY BW BWS RATIOS PEER_PRE PEER_DEC PAIRED
    for t in $THREADS; do
        # ROUNDS runs, each between two bandwidth measurements at the same thread count: a run's
        # ceiling is the better of the two around it; the table's is the best of the window
        B_PREV="$(bw_now "$t")"; BWS[$t]="$B_PREV"; BW[$t]="$B_PREV"
        PRE[$t]=0; DEC[$t]=0; DECS[$t]=""; RATIOS[$t]=""; LOADS[$t]=""; RSS[$t]=0; RUNBUSY[$t]=""
        for r in $(seq "$ROUNDS"); do
            note "run $r/$ROUNDS: $DT, $t thread(s), prompt $NPROMPT ids, $NGEN greedy tokens ..."
            BUSY="$(busy_list)"
            [ -z "$BUSY" ] || { note "warning: the machine is busy:$BUSY — these numbers will be low"; RUNBUSY[$t]+="$BUSY"; }
            ERR="$OUT/run-$DT-t$t-$r.err"
            # shellcheck disable=SC2086   # ZAYA_FLAGS is a list of flags
            if ! /usr/bin/time -v -o "$OUT/run-$DT-t$t-$r.time" "$ZAYA" "$BLOB" --ids "$IDS" -n "$NGEN" -t 0 \
                    --threads "$t" --print-ids ${ZAYA_FLAGS-} >"$OUT/run-$DT-t$t-$r.out" 2>"$ERR"; then
                tail -5 "$ERR" >&2; die "$ZAYA failed ($ERR)"
            fi
            L="$(sed -n 's/^load: \([0-9.]*\) s.*/\1/p' "$ERR" | tail -1)"
            P="$(sed -n 's/^prefill: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$ERR" | tail -1)"
            D="$(sed -n 's/^decode: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$ERR" | tail -1)"
            R="$(rss_gb "$(time_field 'Maximum resident set size (kbytes)' "$OUT/run-$DT-t$t-$r.time")")"
            [ -n "$L" ] || die "no 'load: S s' line from $ZAYA in $ERR"
            [ -n "$P" ] || die "no 'prefill: N tokens in S s (T tok/s)' line from $ZAYA in $ERR"
            [ -n "$D" ] || die "no 'decode: N tokens in S s (T tok/s)' line from $ZAYA in $ERR"
            B_NEXT="$(bw_now "$t")"; BWS[$t]+=" $B_NEXT"
            RATIO="$(awk -v d="$D" -v a="$B_PREV" -v b="$B_NEXT" -v n="$BPT" 'BEGIN { printf "%.2f", d / ((a > b ? a : b) * 1e9 / n) }')"
            note "  load $L s, prefill $P tok/s, decode $D tok/s, peak RSS $R GiB; read $B_PREV / $B_NEXT GB/s around it: decode / ceiling $RATIO"
            PRE[$t]="$(awk -v a="${PRE[$t]}" -v b="$P" 'BEGIN { print (b > a ? b : a) }')"
            DEC[$t]="$(awk -v a="${DEC[$t]}" -v b="$D" 'BEGIN { print (b > a ? b : a) }')"
            BW[$t]="$(awk -v a="${BW[$t]}" -v b="$B_NEXT" 'BEGIN { print (b > a ? b : a) }')"
            RSS[$t]="$(awk -v a="${RSS[$t]}" -v b="$R" 'BEGIN { print (b > a ? b : a) }')"
            DECS[$t]+="${DECS[$t]:+ }$D"; RATIOS[$t]+="${RATIOS[$t]:+ }$RATIO"; LOADS[$t]+="${LOADS[$t]:+ }$L"
            B_PREV="$B_NEXT"
        done
        note "paired: $NGEN decode steps, each followed by a plain read of the bytes it reads, $t thread(s) ..."
        # shellcheck disable=SC2086   # DVR_FLAGS is empty or one flag
        DVR="$("$DVR_BIN" "$BLOB" --ids "$IDS" --threads "$t" -n "$NGEN" $DVR_FLAGS 2>"$OUT/paired-$DT-t$t.err")" \
            || { tail -5 "$OUT/paired-$DT-t$t.err" >&2; die "decode_vs_read failed ($OUT/paired-$DT-t$t.err)"; }
        PAIRED[$t]="$(awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            printf "%s (median %s; %s tok/s at %s GB/s)", v["ratio"], v["ratio_median"], v["decode_tok/s"], v["read_GB/s"] }' <<<"$DVR")"
        note "  paired decode / read: ${PAIRED[$t]}"
        if [ "$PEER" = 1 ] && [ "$DT" = int8 ]; then
            note "peer: llama-bench, $t thread(s), pp$NPROMPT + tg$NGEN, 3 repetitions ..."
            if ! "$PEER_BENCH" -m "$PEER_MODEL" -p "$NPROMPT" -n "$NGEN" "${PEER_DEPTH_ARGS[@]}" -t "$t" -r 3 -mmp 0 -o csv \
                    >"$OUT/peer-t$t.csv" 2>"$OUT/peer-t$t.err"; then
                tail -5 "$OUT/peer-t$t.err" >&2; die "llama-bench failed ($OUT/peer-t$t.err)"
            fi
            # avg_ts of prompt processing (n_gen = 0) at depth 0 and of generation (n_prompt = 0) at PEER_DEPTH
            read -r PEER_PRE[$t] PEER_DEC[$t] < <("$PYTHON" -c '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
depth = lambda r: r.get("n_depth", "0")
pp = [r["avg_ts"] for r in rows if r["n_gen"] == "0" and depth(r) == "0"]
tg = [r["avg_ts"] for r in rows if r["n_prompt"] == "0" and depth(r) == sys.argv[2]]
print("%.2f %.2f" % (float(pp[0]), float(tg[0])) if pp and tg else "- -")' "$OUT/peer-t$t.csv" "$PEER_DEPTH")
            [ "${PEER_PRE[$t]}" != "-" ] || die "cannot read avg_ts from $OUT/peer-t$t.csv"
            note "  llama.cpp: pp$NPROMPT ${PEER_PRE[$t]} tok/s, tg$NGEN ${PEER_DEC[$t]} tok/s"
        fi
    done

    # (e) the table
    RES="$OUT/results-$DT.md"
    {
        echo "### zaya.c $COMMIT, $DT blob ($BLOB_GB GB), $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        echo "Machine: $CPU, $NCPU cpus, $MEM; load average at the start $LOAD; busy processes at the start:"
        echo "${BUSY0:-none}. Rows with other busy processes are not valid measurements."
        echo "Checkpoint: $CKPT. Prompt $NPROMPT ids, $NGEN greedy tokens. Export: $EXP_WALL, peak RSS $EXP_RSS."
        echo "Bytes read per decoded token: $(awk -v b="$BPT" 'BEGIN { printf "%.3f GB", b / 1e9 }') (weights:"
        echo "attention + router + norms of every layer, one expert per layer, the whole LM head; KV cache excluded)."
        echo
        if [ "$PEER" = 1 ] && [ "$DT" = int8 ]; then
            echo "llama.cpp: measured right after the zaya.c runs at each thread count by llama-bench on $PEER_MODEL"
            if [ "$PEER_DEPTH" = 0 ]; then CONTEXT="its tg$NGEN starts from an empty context (no -d in that llama-bench), ours after the $NPROMPT-id prompt"
            else CONTEXT="its pp$NPROMPT from an empty context, its tg$NGEN after $PEER_DEPTH positions (-d $PEER_DEPTH), like ours after the prompt"; fi
            echo "($(stat -L -c %s "$PEER_MODEL") bytes); $CONTEXT."
        else
            echo "llama.cpp: the issue's figures (Q8_0, ZAYA port of PR #23112, another AMD EPYC Zen 4 2-vCPU machine),"
            echo "not measured in this run (set PEER_BENCH and PEER_MODEL to measure it)."
        fi
        echo
        echo "Each thread count: $ROUNDS runs, each between two bandwidth measurements (best of 3 passes) at that"
        echo "thread count. prefill and decode: the best run; decode per run: every run in order. read GB/s:"
        echo "the best measurement of that window; decode / ceiling: best decode over the ceiling from it; per run:"
        echo "each run over the ceiling from the better of the two measurements around it. paired: bench/decode_vs_read.c,"
        echo "$NGEN decode steps each followed by a plain read of the same weight bytes (same process, memory and threads):"
        echo "total read time / total decode time, the median of the per-step ratios, and the two speeds."
        echo
        echo "| threads | prefill tok/s | decode tok/s | decode per run | load s | peak RSS GiB | read GB/s | ceiling tok/s | decode / ceiling | per run | paired decode / read | llama.cpp decode | llama.cpp pp$NPROMPT | other busy processes |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for t in $THREADS; do
            if [ -n "${PEER_DEC[$t]:-}" ]; then PEER_D="${PEER_DEC[$t]}"; PEER_P="${PEER_PRE[$t]}"
            else case "$t" in 1) PEER_D="13.3-13.7"; PEER_P="35" ;; 2) PEER_D="17.2-17.5"; PEER_P="55-67" ;; *) PEER_D="-"; PEER_P="-" ;; esac
            fi
            awk -v t="$t" -v p="${PRE[$t]}" -v d="${DEC[$t]}" -v ds="${DECS[$t]}" -v l="${LOADS[$t]}" -v r="${RSS[$t]}" \
                -v bw="${BW[$t]}" -v b="$BPT" -v rs="${RATIOS[$t]}" -v pr="${PAIRED[$t]}" -v pd="$PEER_D" -v pp="$PEER_P" -v la="${RUNBUSY[$t]:-none}" 'BEGIN {
                c = bw * 1e9 / b
                printf "| %d | %.2f | %.2f | %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |\n", t, p, d, ds, l, r, bw, c, d / c, rs, pr, pd, pp, la }'
        done
        echo
        for t in $THREADS; do echo "Read GB/s at $t thread(s), in order around the runs: ${BWS[$t]}."; done
        echo
        echo "Bytes per token by part:"
        echo
        cat "$OUT/bytes-$DT.md"
    } | tee "$RES"
    note "saved $RES"
    unset PRE DEC DECS LOADS RSS RUNBUSY BW BWS RATIOS PEER_PRE PEER_DEC
done
