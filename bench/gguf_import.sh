#!/usr/bin/env bash
# bench/gguf_import.sh - export_weights.py MODEL.gguf of two checkouts against the disk itself, alternating.
#
#   A=old/export_weights.py B=export_weights.py GGUF=model.gguf TOK=checkpoint_folder OUT=scratch_dir
#   [ROUNDS=5] bench/gguf_import.sh
#
# Each round, in an order that rotates from round to round so host drift falls on every step alike: A's export
# of GGUF into OUT/A.bin, B's into OUT/B.bin, `dd` of as many zero bytes as B's blob (1 MiB blocks, no fsync,
# as the exporters write) and `cat GGUF > /dev/null` (the read side). Each step starts after a `sync` and its time
# includes `sync` of its output file (fsync): the time to the disk, not to the page cache. Each output is deleted before
# the next step (one blob on the disk at a time). Prints one line per run (seconds of wall time), then
# per step the median and range (Bdata: the tensor-data part of B's time, from its last line), and the
# per-round ratios A/B, B/dd as median (range). The warm-up export's blob
# is B's; SHA256=1 prints its SHA-256 (to compare with A's, or with ZAYA_GGUF_PYTHON=1's) before deleting it.
set -euo pipefail
A=${A:?set A to the old export_weights.py}; B=${B:?set B to the new export_weights.py}
GGUF=${GGUF:?set GGUF to a .gguf}; TOK=${TOK:?set TOK to the checkpoint folder (--tokenizer)}
OUT=${OUT:?set OUT to a scratch folder}; ROUNDS=${ROUNDS:-5}; PY=${PY:-python3}
mkdir -p "$OUT"
LOG=$(mktemp); trap 'rm -f "$LOG"' EXIT
now() { date +%s.%N; }
step() {   # step NAME ROUND
    local t0 t1; sync; t0=$(now)   # no dirty pages of an earlier step (untimed); each step's time includes an
    local out="$OUT/$1.bin"          # fsync of its own output (`sync FILE`)
    case "$1" in
    A) "$PY" "$A" "$GGUF" "$OUT/A.bin" --tokenizer "$TOK" > "$OUT/a.log" 2>&1 || { cat "$OUT/a.log" >&2; exit 1; } ;;
    B) "$PY" "$B" "$GGUF" "$OUT/B.bin" --tokenizer "$TOK" > "$OUT/b.log" 2>&1 || { cat "$OUT/b.log" >&2; exit 1; } ;;
    dd) dd if=/dev/zero of="$OUT/dd.bin" bs=1M count=$((BYTES >> 20)) status=none ;;
    cat) cat "$GGUF" > /dev/null ;;
    esac
    [ ! -f "$out" ] || sync "$out"
    t1=$(now)
    echo "$1 $2 $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" | tee -a "$LOG"
    if [ "$1" = B ]; then   # B's own account of its tensor data phase (the exporter's last line), as step "Bdata"
        sed -n 's/.*(tensor data \([0-9.]*\) s.*/Bdata '"$2"' \1/p' "$OUT/b.log" | tee -a "$LOG"
    fi
    rm -f "$OUT/A.bin" "$OUT/B.bin" "$OUT/dd.bin"
}
"$PY" "$B" "$GGUF" "$OUT/b.bin" --tokenizer "$TOK" > "$OUT/b.log" 2>&1 || { cat "$OUT/b.log" >&2; exit 1; }
BYTES=$(stat -c %s "$OUT/b.bin")   # a warm-up export (helpers built, GGUF in the page cache)
[ -z "${SHA256:-}" ] || sha256sum "$OUT/b.bin"
rm -f "$OUT/b.bin"
echo "blob $BYTES bytes; GGUF $(stat -c %s "$GGUF") bytes"
ORDERS=("A B dd cat" "B dd cat A" "dd cat A B" "cat A B dd")
for r in $(seq 1 "$ROUNDS"); do
    for s in ${ORDERS[$(((r - 1) % 4))]}; do step "$s" "$r"; done
done
awk '{ t[$1, $2] = $3; v[$1] = v[$1] " " $3; r[$2] = 1 }
function med(s,   a, n, i, j, x) {
    n = split(s, a, " ")
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
function lo(s,   a, n, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] < m) m = a[i]
    return m }
function hi(s,   a, n, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]
    return m }
END { for (k in v) printf "%-4s median %7.2f s  range %.2f-%.2f\n", k, med(v[k]), lo(v[k]), hi(v[k])
      for (i in r) { ab = ab " " t["A", i] / t["B", i]; bd = bd " " t["B", i] / t["dd", i] }
      printf "A/B  %.2f (%.2f-%.2f)\n", med(ab), lo(ab), hi(ab)
      printf "B/dd %.2f (%.2f-%.2f)\n", med(bd), lo(bd), hi(bd) }' "$LOG"
