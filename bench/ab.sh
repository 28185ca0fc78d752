#!/usr/bin/env bash
# bench/ab.sh - two zaya.c builds (and optionally llama.cpp's llama-bench) side by side, alternating.
#
#   A=path/zaya B=path/zaya BLOB=model.bin [PEER_BENCH=llama-bench PEER_MODEL=model-Q8_0.gguf]
#   [ROUNDS=5] [NGEN=32] [THREADS="1 2"] bench/ab.sh
#
# Each round runs, at each thread count, `A BLOB --ids <bench.sh's 128 ids> -n NGEN -t 0 --threads N` and
# the same with B (and llama-bench -p 128 -n NGEN -d 0,128 -t N -r 1 -mmp 0 with a peer), in an order that
# alternates from round to round, so host drift falls on every engine alike. Prints one line per run
# (prefill 128 ids and decode NGEN tokens after them, tok/s), then per engine and thread count the median
# and range of each, and the ratios B/A (and B/peer: llama-bench's pp128 and its tg at depth 128) per
# round as median (range). Needs nothing but bash, awk and sort.
set -euo pipefail
A=${A:?set A to the first zaya build}; B=${B:?set B to the second zaya build}; BLOB=${BLOB:?set BLOB to a model blob}
ROUNDS=${ROUNDS:-5}; NGEN=${NGEN:-32}; THREADS=${THREADS:-"1 2"}
IDS="$(awk -v n=128 'BEGIN { x = 12345; s = "2";
    for (i = 1; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; s = s "," (300 + x % 200000) }
    print s }')"   # bench.sh's 128 prompt ids
LOG=$(mktemp); trap 'rm -f "$LOG"' EXIT
zaya() {   # zaya ENGINE_LABEL EXE THREADS ROUND
    local err; err=$("$2" "$BLOB" --ids "$IDS" -n "$NGEN" -t 0 --threads "$3" 2>&1 >/dev/null)
    local p d; p=$(sed -n 's/^prefill: .*(\([0-9.]*\) tok\/s).*/\1/p' <<< "$err"); d=$(sed -n 's/^decode: .*(\([0-9.]*\) tok\/s).*/\1/p' <<< "$err")
    [ -n "$p" ] && [ -n "$d" ] || { echo "bench/ab.sh: $2 printed no prefill/decode line:" >&2; tail -3 <<< "$err" >&2; exit 1; }
    echo "$1 $3 $4 $p $d" | tee -a "$LOG"
}
peer() {   # peer THREADS ROUND: llama-bench's pp128 at depth 0 and tg at depth 128 (after the prompt, like ours)
    local csv; csv=$("$PEER_BENCH" -m "$PEER_MODEL" -p 128 -n "$NGEN" -d 0,128 -t "$1" -r 1 -mmp 0 -o csv 2>/dev/null)
    local p d; p=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) h[$i] = i; next }
        { g = $h["n_gen"]; dd = $h["n_depth"]; gsub(/"/, "", g); gsub(/"/, "", dd); v = $h["avg_ts"]; gsub(/"/, "", v)
          if (g == "0" && dd == "0") print v }' <<< "$csv")
    d=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) h[$i] = i; next }
        { g = $h["n_gen"]; dd = $h["n_depth"]; gsub(/"/, "", g); gsub(/"/, "", dd); v = $h["avg_ts"]; gsub(/"/, "", v)
          if (g != "0" && dd == "128") print v }' <<< "$csv")
    [ -n "$p" ] && [ -n "$d" ] || { echo "bench/ab.sh: llama-bench gave no pp128 / tg at depth 128" >&2; exit 1; }
    echo "peer $1 $2 $p $d" | tee -a "$LOG"
}
echo "engine threads round prefill_tok/s decode_tok/s   (A=$A B=$B${PEER_BENCH:+ peer=$PEER_MODEL}; $(date -u +%FT%TZ))"
cat "$BLOB" > /dev/null
for r in $(seq "$ROUNDS"); do
    for t in $THREADS; do
        if [ $((r % 2)) = 1 ]; then zaya A "$A" "$t" "$r"; zaya B "$B" "$t" "$r"; [ -z "${PEER_BENCH:-}" ] || peer "$t" "$r"
        else [ -z "${PEER_BENCH:-}" ] || peer "$t" "$r"; zaya B "$B" "$t" "$r"; zaya A "$A" "$t" "$r"; fi
    done
done
echo
echo "medians (range) over $ROUNDS rounds, tok/s; ratios per round:"
for e in A B peer; do for t in $THREADS; do
    for col in 4 5; do
        awk -v e=$e -v t=$t -v c=$col '$1 == e && $2 == t { print $c }' "$LOG" | sort -g |
            awk -v e=$e -v t=$t -v c=$col 'NR > 0 { v[NR] = $1 } END { if (NR) printf "%-4s %s threads %-7s %8.2f (%.2f-%.2f)\n", e, t,
                c == 4 ? "prefill" : "decode", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'
    done
done; done
for other in A peer; do for t in $THREADS; do for col in 4 5; do
    awk -v o=$other -v t=$t -v c=$col '$2 == t && ($1 == "B" || $1 == o) { x[$1 "," $3] = $c; r[$3] = 1 }
        END { for (k in r) if ((o "," k) in x) print x["B," k] / x[o "," k] }' "$LOG" | sort -g |
        awk -v o=$other -v t=$t -v c=$col '{ v[NR] = $1 } END { if (NR) printf "B/%-4s %s threads %-7s %6.2f (%.2f-%.2f)\n", o, t,
            c == 4 ? "prefill" : "decode", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'
done; done; done
