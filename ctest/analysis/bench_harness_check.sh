#!/usr/bin/env bash
# bench_harness_check.sh REPO OUTDIR
# bench/common.sh, the harness of every bench/study_*.sh, with stand-ins for lmscale and the peer's
# python:
# - a study of REPEATS = 2 whose lmscale run and peer share a case keeps all four results
#   (lmscale_1.h5, lmscale_2.h5, peer_1.jsonl, peer_2.jsonl);
# - a case run once before the repeated runs (bench/study_fp8.sh's text runs) keeps its result;
# - a second study clears what the first left in the cases it runs, and only there (a case it
#   skips keeps its results).
# (The harness once cleared a case's folder when the peer of run 1 started, losing lmscale's run 1.)
set -euo pipefail
repo=$1 out=$(realpath -m "$2")
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
study() {   # study SKIP_ONCE: runs case "once" (RUN = 1, outside repeat) unless SKIP_ONCE is set
  (
    unset DRY_RUN
    export LMSCALE="$out/bin/lmscale" PYTHON="$out/bin/python" REPEATS=2 OUT="$out/study"
    STUDY=harness
    # shellcheck source=/dev/null
    source "$repo/bench/common.sh"
    if [ -z "$1" ]; then
      RUN=1
      lm once 1 inputs/pp_xl_1gpu.ini
      RUN=0
    fi
    runs() {
      lm shared 1 inputs/pp_xl_1gpu.ini
      peer shared 1 model --size xl
    }
    repeat runs
  ) > "$out/study.log" 2>&1
}
expect() {   # expect FILE...: each present and not empty
  for f in "$@"; do
    test -s "$out/study/$f" || { echo "FAIL: $f missing"; ls -lR "$out/study"; exit 1; }
  done
}
study ""
expect shared/lmscale_1.h5 shared/lmscale_2.h5 shared/peer_1.jsonl shared/peer_2.jsonl once/lmscale_1.h5
echo stale > "$out/study/shared/lmscale_3.h5"   # a third run of the earlier study
echo earlier > "$out/study/once/lmscale_1.h5"
study skip-once
if [ -e "$out/study/shared/lmscale_3.h5" ]; then echo "FAIL: an earlier study's shared/lmscale_3.h5 survived"; exit 1; fi
expect shared/lmscale_1.h5 shared/lmscale_2.h5 shared/peer_1.jsonl shared/peer_2.jsonl
grep -qx earlier "$out/study/once/lmscale_1.h5" || { echo "FAIL: a case the second study skipped lost its result"; exit 1; }
echo "bench harness: both sides' runs kept, a run outside repeat kept, an earlier study's cleared where rerun"
