#!/usr/bin/env bash
# bench_harness_check.sh REPO OUTDIR
# bench/common.sh, the harness of every bench/study_*.sh, with stand-ins for lmscale and the peer's
# python: a study of REPEATS = 2 whose lmscale run and peer share a case keeps all four results
# (lmscale_1.h5, lmscale_2.h5, peer_1.jsonl, peer_2.jsonl), and a second study clears the first's.
# (The harness once cleared a case's folder when the peer of run 1 started, losing lmscale's run 1.)
set -euo pipefail
repo=$1 out=$2
rm -rf "$out"
mkdir -p "$out/bin"
cat > "$out/bin/lmscale" <<'SH'
#!/usr/bin/env bash
for a in "$@"; do case $a in --run.output=*) echo fake > "${a#--run.output=}";; esac; done
SH
cat > "$out/bin/python" <<'SH'
#!/usr/bin/env bash
echo '{"step_ms": 1.0}'
SH
chmod +x "$out/bin/lmscale" "$out/bin/python"
study() {
  (
    export LMSCALE="$out/bin/lmscale" PYTHON="$out/bin/python" REPEATS=2 OUT="$out/study"
    STUDY=harness
    # shellcheck source=/dev/null
    source "$repo/bench/common.sh"
    runs() {
      lm shared 1 inputs/pp_xl_1gpu.ini
      peer shared 1 model --size xl
    }
    repeat runs
  )
}
study
for f in lmscale_1.h5 lmscale_2.h5 peer_1.jsonl peer_2.jsonl; do
  test -s "$out/study/shared/$f" || { echo "FAIL: $f missing after a study of 2 runs"; ls -l "$out/study/shared"; exit 1; }
done
echo stale > "$out/study/shared/lmscale_3.h5"   # a third run of an earlier study
study
if [ -e "$out/study/shared/lmscale_3.h5" ]; then echo "FAIL: an earlier study's lmscale_3.h5 survived"; exit 1; fi
echo "bench harness: both sides' runs kept, an earlier study's cleared"
