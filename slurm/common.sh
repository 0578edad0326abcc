# Shared by the slurm/*.sbatch job scripts (sourced, not run). Bash.
#
# Provides:
#   lmscale_parse_args ARGS...   positional DECK and OUTDIR (or env DECK / OUTDIR), --section.key=value
#                                overrides; sets LMSCALE_DECK, LMSCALE_OUTDIR, LMSCALE_OVERRIDES
#   lmscale_default KEY VALUE    adds --KEY=VALUE unless the user already overrode KEY
#   lmscale_launch TAG [srun options...]
#                                prints the job header and `lmscale DECK --print-config`, then runs
#                                `srun --mpi=pmix lmscale DECK overrides` and returns its exit code.
#                                With OUTDIR set, the results go to OUTDIR/<deck stem>-TAG.h5.
# Binary: $LMSCALE_BIN, else $LMSCALE_ROOT/build/lmscale (LMSCALE_ROOT is set by the job script).

# NVLink multicast (NVLS) stays off in NCCL, NVSHMEM and PyTorch symmetric memory: on shared
# multi-GPU hosts a program using it can take the host's GPUs out of service. Project rule.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

LMSCALE_BIN=${LMSCALE_BIN:-${LMSCALE_ROOT:-.}/build/lmscale}

lmscale_die() { echo "lmscale job: $*" >&2; exit "${2:-1}"; }

lmscale_parse_args() {
  LMSCALE_DECK=${DECK:-} LMSCALE_OUTDIR=${OUTDIR:-} LMSCALE_OVERRIDES=()
  local npos=0 a
  for a in "$@"; do
    if [[ $a == --* ]]; then
      LMSCALE_OVERRIDES+=("$a")
    else
      case $npos in
        0) LMSCALE_DECK=$a ;;
        1) LMSCALE_OUTDIR=$a ;;
        *) lmscale_die "unexpected argument '$a' (usage: DECK [OUTDIR] [--section.key=value ...])" 2 ;;
      esac
      npos=$((npos + 1))
    fi
  done
  [[ -n $LMSCALE_DECK ]] || lmscale_die "no deck: pass DECK as first argument or set DECK=" 2
  [[ -r $LMSCALE_DECK ]] || lmscale_die "cannot read deck '$LMSCALE_DECK' (cwd $(pwd))" 2
}

lmscale_default() {  # KEY VALUE
  local a
  for a in "${LMSCALE_OVERRIDES[@]}"; do [[ $a == "--$1="* ]] && return 0; done
  LMSCALE_OVERRIDES+=("--$1=$2")
}

lmscale_launch() {  # TAG [srun options...]
  local tag=$1; shift
  [[ -x $LMSCALE_BIN ]] || lmscale_die "no lmscale executable at '$LMSCALE_BIN' (build it, or set LMSCALE_BIN)"
  if [[ -n $LMSCALE_OUTDIR ]]; then
    mkdir -p "$LMSCALE_OUTDIR" || lmscale_die "cannot create $LMSCALE_OUTDIR"
    local stem; stem=$(basename "$LMSCALE_DECK"); stem=${stem%.*}
    lmscale_default run.output "$LMSCALE_OUTDIR/$stem-$tag.h5"
  fi
  local cmd=("$LMSCALE_BIN" "$LMSCALE_DECK" "${LMSCALE_OVERRIDES[@]}")

  echo "== lmscale job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_TASK_ID:+ (array ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})} on ${SLURM_JOB_NODELIST:-$(hostname -s)}"
  echo "   nodes ${SLURM_JOB_NUM_NODES:-1}, tasks ${SLURM_NTASKS:-1}, cpus/task ${SLURM_CPUS_PER_TASK:-1}, gpus/node ${SLURM_GPUS_ON_NODE:-0}, $(date -u +%FT%TZ)"
  echo "   repository ${LMSCALE_ROOT:-?}"
  echo "   ${cmd[*]}"
  echo "== resolved configuration"
  "${cmd[@]}" --print-config
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "lmscale job: --print-config failed (exit $rc; 2 = bad deck), not launching" >&2
    return "$rc"
  fi
  echo "== run"
  # srun does not inherit --cpus-per-task in 22.05: pass it on. When one rank fails, the pmix
  # plugin ends the step and srun reports the others' signal (137/143) as its exit code, which
  # would hide lmscale's 1 or 2: take the code from srun's "Exited with exit code N" lines then.
  local errf; errf=$(mktemp "${TMPDIR:-/tmp}/lmscale-srun.XXXXXX")
  { srun --mpi=pmix ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} "$@" "${cmd[@]}" \
      2>&1 1>&3 3>&- | tee "$errf" >&2 3>&-; } 3>&1
  rc=${PIPESTATUS[0]}
  if (( rc > 128 )); then
    local own
    own=$(sed -n 's/^srun: error: .*: tasks\{0,1\} [0-9,-]*: Exited with exit code \([0-9]*\).*/\1/p' "$errf" | sort -n | tail -n 1)
    if [[ -n $own ]]; then
      echo "lmscale job: srun exit $rc (ranks killed after a rank failed); lmscale exit code $own" >&2
      rc=$own
    fi
  fi
  rm -f "$errf"
  echo "== lmscale exit $rc ($(date -u +%FT%TZ))"
  return "$rc"
}
