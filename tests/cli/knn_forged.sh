#!/usr/bin/env bash
# kNN-LM stores forged behind a valid checksum, through the real binary:
# train a tiny model, build a store of each index kind, then patch the
# FAISS index inside them (hnsw links out of range, an ivf cell size of
# 2^40, NaN keys) and recompute the checksum. `eval --knn` must refuse each
# with one error naming the store: exit status 1, no crash (a signal), no
# "out of memory". And `knn build` under `ulimit -f` must name the store it
# could not write. Usage: knn_forged.sh path/to/tapeformer
set -u
bin=${1:?usage: knn_forged.sh TAPEFORMER_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat > "$work/tiny.json" <<'JSON'
{"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
 "train": {"batch_size": 4, "max_iters": 10}, "schedule": {"warmup_iters": 2, "decay_iters": 10},
 "eval": {"interval": 10, "iters": 2, "final_iters": 2}, "checkpoint": {"interval": 10}, "log": {"interval": 10}}
JSON
for i in $(seq 60); do echo "The quick brown fox jumps over the lazy dog, line $i."; done > "$work/text.txt"
"$bin" train --config "$work/tiny.json" --data "$work/text.txt" --out "$work/run" > /dev/null 2> "$work/train.log" ||
  { cat "$work/train.log"; echo "FAIL: training"; exit 1; }

for kind in exact ivf hnsw; do
  "$bin" knn build --checkpoint "$work/run" --data "$work/text.txt" --split train --out "$work/$kind.knn" \
    --index "$kind" --hnsw-m 4 > /dev/null 2> "$work/build.err" ||
    { cat "$work/build.err"; echo "FAIL: knn build --index $kind"; exit 1; }
done
"$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val --knn "$work/hnsw.knn" > /dev/null ||
  fail "eval --knn on the unforged hnsw store"

# forge KIND DAMAGE OUT: the store KIND.knn with DAMAGE done to its FAISS
# index (the layouts of retrieval/datastore.h and FAISS 1.7's write_index),
# the header's checksum (FNV-1a 64 of the payload, core/files.h) made to match.
forge() {
  python3 - "$work/$1.knn" "$2" "$3" <<'PY'
import struct, sys
src, damage, out = sys.argv[1:]
data = bytearray(open(src, 'rb').read())
H = 28  # magic, version, payload length, checksum
p = data[H:]
def u64(at): return struct.unpack_from('<Q', p, at)[0]
dim, count, source = struct.unpack_from('<q', p, 24)[0], struct.unpack_from('<q', p, 32)[0], u64(40)
i = 48 + source + 4 * count                   # the VectorIndex: dim, kind, four options, a flag
i += 16 + u64(i + 8) + 32 + 1
tag, header = bytes(p[i:i + 4]), 37           # fourcc, d, ntotal, two unused, is_trained, metric
i += header
if damage == 'nan_key':                       # the first key of an exact store
    assert tag == b'IxF2'
    struct.pack_into('<f', p, i + 8, float('nan'))
elif damage == 'huge_cell':                   # an ivf cell of 2^40 keys
    assert tag == b'IwFl'
    nlist = u64(i)
    i += 16 + header + 8 + 4 * nlist * dim    # nlist, nprobe, the centroids
    i += 9 + 20                               # an empty direct map; "ilar", nlist, code size
    assert bytes(p[i:i + 4]) == b'full'
    struct.pack_into('<Q', p, i + 12, 1 << 40)
elif damage == 'bad_links':                   # every hnsw link to a node that does not exist
    assert tag == b'IHNf'
    for size in (8, 4, 4, 8):                 # level probabilities, links per level, levels, offsets
        i += 8 + size * u64(i)
    for j in range(u64(i)):
        at = i + 8 + 4 * j
        if struct.unpack_from('<i', p, at)[0] >= 0:
            struct.pack_into('<i', p, at, 1 << 30)
else:
    sys.exit('unknown damage ' + damage)
h = 0xcbf29ce484222325
for b in p:
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
struct.pack_into('<Q', data, 20, h)
data[H:] = p
open(out, 'wb').write(data)
PY
}

# refused NAME STORE WANT: eval --knn STORE exits 1 with an error naming it and WANT.
refused() {
  local name=$1 store=$2 want=$3 status err
  "$bin" eval --checkpoint "$work/run" --data "$work/text.txt" --split val --knn "$store" > /dev/null 2> "$work/err"
  status=$?
  err=$(cat "$work/err")
  if [ $status -ge 128 ]; then fail "$name: killed by signal $((status - 128)): $err"; return; fi
  [ $status -eq 1 ] || { fail "$name: exit status $status (want 1): $err"; return; }
  case $err in *"out of memory"*) fail "$name: '$err' blames memory"; return ;; esac
  case $err in *"kNN store '$store'"*) ;; *) fail "$name: '$err' does not name the store '$store'"; return ;; esac
  case $err in *"$want"*) ;; *) fail "$name: '$err' does not say '$want'"; return ;; esac
  echo "ok   $name: $err"
}

forge hnsw bad_links "$work/bad_links.knn" && refused "hnsw links out of range" "$work/bad_links.knn" "links to 1073741824"
forge ivf huge_cell "$work/huge_cell.knn" && refused "ivf cell of 2^40 keys" "$work/huge_cell.knn" "claims 1099511627776 keys"
forge exact nan_key "$work/nan_key.knn" && refused "NaN key" "$work/nan_key.knn" "non-finite value (nan)"

# A write cut short by a file size limit (20 KB; the store is about 200 KB).
(ulimit -f 20; exec "$bin" knn build --checkpoint "$work/run" --data "$work/text.txt" --split train \
   --out "$work/limited.knn" > /dev/null 2> "$work/err")
status=$?
err=$(cat "$work/err")
if [ $status -ge 128 ] || [ $status -eq 0 ]; then
  fail "knn build under ulimit -f: exit status $status: $err"
else
  case $err in
    *"cannot write the kNN store '$work/limited.knn': file too large (ulimit -f?)"*) echo "ok   knn build under ulimit -f: $err" ;;
    *) fail "knn build under ulimit -f: '$err' does not name the store and the limit" ;;
  esac
fi
[ -e "$work/limited.knn" ] && fail "knn build under ulimit -f left a store"
ls -a "$work" | grep -q '\.tmp\.' && fail "knn build under ulimit -f left a temp file"

[ $failures -eq 0 ] && echo "knn_forged: all passed"
[ $failures -eq 0 ]
