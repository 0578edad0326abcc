#!/usr/bin/env bash
# install_check.sh CMAKE BUILD_DIR CHECK_TABLE OUTDIR
# `CMAKE --install BUILD_DIR --prefix OUTDIR/prefix`, then from the installed tree only (run from
# an empty folder, outside the repository): bin/lmscale --version; the quickstart deck
# (share/lmscale/inputs/quickstart.ini, 10 steps instead of 200) on 2 ranks writes 10 training
# rows; the docs, LICENSE, job scripts and analysis package are in place, the installed job
# scripts pick the installed binary, and (when h5py, pandas and matplotlib are importable) the
# installed analysis package reports on the run.
set -euo pipefail
cmake=$1 build=$2 check=$3 out=$4
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$out"; mkdir -p "$out/run"
out=$(cd "$out" && pwd)
prefix=$out/prefix
"$cmake" --install "$build" --prefix "$prefix" > "$out/install.log" || { cat "$out/install.log"; fail "cmake --install failed"; }

for f in bin/lmscale share/lmscale/inputs/quickstart.ini share/lmscale/inputs/text/training_notes.txt \
         share/lmscale/slurm/cpu.sbatch share/lmscale/slurm/common.sh \
         share/lmscale/analysis/pyproject.toml share/lmscale/analysis/report.py share/lmscale/analysis/jobs/train.py \
         share/doc/lmscale/deck.md share/doc/lmscale/README.md share/doc/lmscale/LICENSE; do
  [[ -e $prefix/$f ]] || fail "cmake --install did not install $f"
done
[[ -x $prefix/bin/lmscale ]] || fail "the installed bin/lmscale is not executable"

cd "$out/run"   # nothing of the repository or the build folder around
version=$("$prefix/bin/lmscale" --version)
[[ $version == "lmscale "* ]] || fail "--version printed '$version'"
echo "$version"

mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 "$prefix/bin/lmscale" \
  "$prefix/share/lmscale/inputs/quickstart.ini" --train.steps=10 --train.log_every=5 --train.eval_every=5 \
  --optim.warmup_steps=2 --run.output=quickstart.h5 --train.save=quickstart_weights.h5
rows=$("$check" quickstart.h5 /train/steps step - 0 | wc -l)
[[ $rows -eq 10 ]] || fail "the installed quickstart logged $rows steps, expected 10"
[[ -f quickstart_weights.h5 ]] || fail "the installed quickstart saved no weights"
echo "installed quickstart: 10 steps"

bin=$(LMSCALE_ROOT=$prefix/share/lmscale bash -c 'source "$LMSCALE_ROOT/slurm/common.sh"; lmscale_default_bin')
[[ $bin == "$prefix/bin/lmscale" ]] || fail "the installed job scripts would run '$bin', not $prefix/bin/lmscale"

py=${PYTHON:-python3}
if "$py" -c 'import h5py, pandas, matplotlib' 2>/dev/null; then
  PYTHONPATH=$prefix/share/lmscale MPLBACKEND=Agg "$py" -m analysis.report quickstart.h5 --out report --format md >/dev/null
  [[ -s report/index.md ]] || fail "the installed analysis package wrote no report/index.md"
  echo "installed analysis package: report written"
else
  echo "installed analysis package not run: h5py, pandas or matplotlib missing"
fi
echo "PASS"
