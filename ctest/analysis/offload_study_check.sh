#!/usr/bin/env bash
# CTest analysis.offload_study: analysis/offload_study.py on a study folder laid out as
# bench/study_offload.sh writes it, from tiny CPU bench-model runs (fsdp on 2 ranks, with and
# without parallel.offload) and one peer line: the table has the three cases with their step,
# GPU peak and host peak (the lmscale runs' host_peak_resident_bytes), the figure is written, and
# a folder without results is exit 2.
#   offload_study_check.sh LMSCALE DECK OUTDIR
set -uo pipefail
lmscale=$1 deck=$2 out=$3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python3 -c 'import h5py, pandas, matplotlib' 2>/dev/null || { [[ -n ${LMSCALE_REQUIRE_ANALYSIS:-} ]] && exit 1; echo "SKIP: h5py, pandas or matplotlib missing"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$out"; mkdir -p "$out/fsdp_xl" "$out/fsdp_xl_offload" "$out/fsdp_xl_peer_offload" "$out/empty"
mpi() { mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 "$lmscale" "$deck" --run.job=bench-model --parallel.zero=fsdp "$@"; }
mpi --run.output="$out/fsdp_xl/lmscale_1.h5" > "$out/a.log" 2>&1 || { cat "$out/a.log"; fail "bench-model"; }
mpi --parallel.offload=optimizer --run.output="$out/fsdp_xl_offload/lmscale_1.h5" > "$out/b.log" 2>&1 || { cat "$out/b.log"; fail "bench-model with offload"; }
echo '{"peer": "torch", "mode": "fsdp", "step_ms": 2103.6, "peak_gib": 9.523, "host_peak_gib": 21.5, "offload": true}' \
  > "$out/fsdp_xl_peer_offload/peer_1.jsonl"
cd "$repo"
python3 -m analysis.offload_study "$out" --png "$out/offload.png" > "$out/table.md" || { cat "$out/table.md"; fail "offload_study exited $?"; }
cat "$out/table.md"
[[ $(grep -c '^| xl, ' "$out/table.md") -eq 3 ]] || fail "expected 3 case rows"
grep -q '^| xl, torch FSDP2 + CPU offload | 2103.6 | 9.52 | 21.50 | 1 |' "$out/table.md" || fail "peer row"
grep '^| xl, lmscale' "$out/table.md" | grep -q ' - ' && fail "an lmscale row lacks a number"
[[ -s "$out/offload.png" ]] || fail "no figure"
python3 -m analysis.offload_study "$out/empty" > /dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || fail "an empty folder gave exit $rc, expected 2"
echo "ok: analysis.offload_study"
