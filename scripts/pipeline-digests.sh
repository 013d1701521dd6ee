#!/usr/bin/env bash
# The output digests of the shipped pipelines that run on bundled files alone (no broker, no
# database), for one or more riffle binaries side by side: a refactor must leave every digest
# as it was. Each pipeline runs once per binary with `--output` in a scratch folder; its digest
# is the SHA-1 of its result lines, sorted, and of its dead letters, with the fields that
# differ from run to run (times, latencies) left out. The table ends with "equal" or names the
# pipelines whose outputs differ (and the script then exits 1). A pipeline that fails alike
# with every binary (this machine lacks a Python package it needs) is listed as not run here.
#
#   scripts/pipeline-digests.sh OLD_RIFFLE NEW_RIFFLE [PIPELINE...]
#
# camera-versions.yaml plays its cameras in real time for a minute each and is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
bins=()
pipelines=()
for arg in "$@"; do
  case "$arg" in
    *.yaml) pipelines+=("$arg") ;;
    *) bins+=("$arg") ;;
  esac
done
[ "${#bins[@]}" -ge 1 ] || { echo "usage: $0 RIFFLE [RIFFLE...] [PIPELINE.yaml...]" >&2; exit 2; }
if [ "${#pipelines[@]}" -eq 0 ]; then
  for p in pipelines/*.yaml; do
    grep -qE '^  (kafka|redis|postgres|parquet|webhook|http):' "$p" && continue
    [ "$(basename "$p")" = camera-versions.yaml ] && continue
    pipelines+=("$p")
  done
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export RIFFLE_LOG=${RIFFLE_LOG:-warn}

digest() {
  python3 - "$@" <<'PY'
import hashlib, json, sys
# Fields whose values are the run's own clock, not its results.
VOLATILE = ("_ms", "_at", "time", "latency", "epoch")
def clean(value):
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()
                if not any(k.endswith(s) or s in k for s in VOLATILE)}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value
out = []
for path in sys.argv[1:]:
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.dumps(clean(json.loads(line)), sort_keys=True))
    except FileNotFoundError:
        pass
    out.append((len(rows), hashlib.sha1("\n".join(sorted(rows)).encode()).hexdigest()[:12]))
print(" ".join(f"{n}:{h}" for n, h in out))
PY
}

printf '| pipeline |'
for i in "${!bins[@]}"; do printf ' binary %d: results, dead letters |' "$((i + 1))"; done
printf '\n|---|'
for _ in "${bins[@]}"; do printf -- '---|'; done
printf '\n'
differ=()
skipped=()
for p in "${pipelines[@]}"; do
  name=$(basename "$p" .yaml)
  row="| $name |"
  first=""
  failed=0
  for i in "${!bins[@]}"; do
    out="$scratch/$name.$i.jsonl"
    if "${bins[$i]}" run "$p" --output "$out" >"$scratch/$name.$i.log" 2>&1; then
      d=$(digest "$out" "$scratch/$name.$i.dead-letters.jsonl")
    else
      d="failed"
      failed=$((failed + 1))
    fi
    row="$row $d |"
    [ -z "$first" ] && first=$d
    [ "$d" = "$first" ] || differ+=("$name")
  done
  if [ "$failed" = "${#bins[@]}" ]; then
    # Every binary fails alike: this machine lacks what the pipeline needs (a Python package).
    reason=$(grep -m1 -o 'error: .*' "$scratch/$name.0.log" | cut -c1-160)
    row="| $name | not run here: ${reason:-see its log} |"
    skipped+=("$name")
  elif [ "$failed" != 0 ]; then
    echo "pipeline-digests: $p failed with some binaries only; their logs:" >&2
    for i in "${!bins[@]}"; do tail -5 "$scratch/$name.$i.log" >&2; done
  fi
  echo "$row"
done
echo
if [ "${#differ[@]}" -eq 0 ]; then
  echo "equal: every pipeline's outputs are the same for every binary ($(( ${#pipelines[@]} - ${#skipped[@]} )) pipelines${skipped[*]:+; not run here: ${skipped[*]}})"
else
  echo "outputs differ: ${differ[*]}"
  exit 1
fi
