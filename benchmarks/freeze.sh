#!/usr/bin/env bash
# Freeze the production code at a commit (default HEAD) into $BENCH_FROZEN/<commit>, with the
# working tree's benchmarks/ on top, so a long benchmark run measures ONE version of the code
# even while the repository keeps changing. Prints the folder; run the benchmarks from there:
#   src=$(benchmarks/freeze.sh) && (cd "$src" && BENCH_RESULTS=$PWD/benchmarks/results \
#       /work/main/.venv/bin/python -m benchmarks.bench_bulk ...)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rev=${1:-HEAD}
commit=$(git -C "$repo" rev-parse --short "$rev")
dest=${BENCH_FROZEN:-/tmp/bench_src}/$commit
rm -rf "$dest" && mkdir -p "$dest"
git -C "$repo" archive "$commit" | tar -x -C "$dest"
rm -rf "$dest/benchmarks" && mkdir -p "$dest/benchmarks"
cp "$repo"/benchmarks/*.py "$repo"/benchmarks/*.sh "$dest/benchmarks/"
echo "$commit (frozen copy of $(git -C "$repo" log -1 --format='%h %cd' --date=iso "$commit"))" \
    > "$dest/BENCH_SOURCE"
echo "$dest"
