# Shared by the slurm/*.sbatch job scripts (sourced, not run). Bash.
#
# Provides:
#   lmscale_parse_args ARGS...   positional DECK and OUTDIR (or env DECK / OUTDIR), --section.key=value
#                                overrides; sets LMSCALE_DECK, LMSCALE_OUTDIR, LMSCALE_OVERRIDES
#   lmscale_default KEY VALUE    adds --KEY=VALUE unless the user already overrode KEY
#   lmscale_launch TAG [srun options...]
#                                prints the job header and `lmscale DECK --print-config --world-size=N`
#                                (the deck checked, as one process, for the N tasks of the job), then
#                                runs `srun lmscale DECK overrides` and returns its exit code.
#                                With OUTDIR set, the results go to OUTDIR/<deck stem>-TAG.h5.
#
# Environment (all optional; docs/clusters.md and slurm/README.md show uses):
#   LMSCALE_BIN            the executable: default build/lmscale of the repository, else bin/lmscale
#                          of an installed prefix (this file in PREFIX/share/lmscale/slurm), else
#                          `lmscale` on the PATH. A bare name is looked up on the PATH.
#   LMSCALE_ENV            a bash file sourced before anything runs: `module load ...`, `spack load
#                          ...`, site variables (NCCL_SOCKET_IFNAME, ...).
#   LMSCALE_LAUNCH_PREFIX  words put before lmscale, in the check and in every task, e.g.
#                          "apptainer exec --nv lmscale.sif" (split on spaces). With it, LMSCALE_BIN
#                          defaults to `lmscale` (the one inside the container) and is not checked on
#                          the host.
#   LMSCALE_SRUN_MPI       srun's --mpi plugin (pmix, pmi2, ...). Unset: no --mpi, the cluster's
#                          MpiDefault applies. Debian's Open MPI needs pmix.
#   LMSCALE_SRUN_ARGS      more srun options (split on spaces), e.g. "--cpu-bind=cores".

# NVLink multicast (NVLS) stays off in NCCL, NVSHMEM and PyTorch symmetric memory: on shared
# multi-GPU hosts a program using it can take the host's GPUs out of service. Project rule.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

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

# The executable when LMSCALE_BIN is unset (see the header).
lmscale_default_bin() {
  if [[ -n ${LMSCALE_LAUNCH_PREFIX:-} ]]; then echo lmscale; return; fi
  local root=${LMSCALE_ROOT:-.}
  if [[ -x $root/build/lmscale ]]; then echo "$root/build/lmscale"
  elif [[ -x $root/../../bin/lmscale ]]; then (cd "$root/../../bin" && echo "$(pwd)/lmscale")
  else echo lmscale
  fi
}

# The number of tasks srun will start: srun's own -n/--ntasks if given, else the job's.
lmscale_ntasks() {  # [srun options...]
  local n=${SLURM_NTASKS:-${SLURM_NPROCS:-}} prev=""
  if [[ -z $n && ${SLURM_NTASKS_PER_NODE:-} =~ ^[0-9]+$ && ${SLURM_JOB_NUM_NODES:-} =~ ^[0-9]+$ ]]; then
    n=$((SLURM_NTASKS_PER_NODE * SLURM_JOB_NUM_NODES))
  fi
  local a
  for a in "$@"; do
    case $a in
      --ntasks=*) n=${a#--ntasks=} ;;
      -n?*) n=${a#-n} ;;
      *) [[ $prev == -n || $prev == --ntasks ]] && n=$a ;;
    esac
    prev=$a
  done
  echo "${n:-1}"
}

lmscale_launch() {  # TAG [srun options...]
  local tag=$1; shift
  if [[ -n ${LMSCALE_ENV:-} ]]; then
    [[ -r $LMSCALE_ENV ]] || lmscale_die "LMSCALE_ENV=$LMSCALE_ENV: no such readable file (a bash file of module loads, or unset it)" 2
    # shellcheck disable=SC1090
    source "$LMSCALE_ENV" || lmscale_die "sourcing LMSCALE_ENV=$LMSCALE_ENV failed"
  fi
  local prefix=() srun_args=()
  read -r -a prefix <<<"${LMSCALE_LAUNCH_PREFIX:-}"
  read -r -a srun_args <<<"${LMSCALE_SRUN_ARGS:-}"
  [[ -n ${LMSCALE_SRUN_MPI:-} ]] && srun_args=("--mpi=$LMSCALE_SRUN_MPI" "${srun_args[@]}")
  local bin=${LMSCALE_BIN:-$(lmscale_default_bin)}
  if [[ ${#prefix[@]} -eq 0 ]]; then
    if [[ $bin == */* ]]; then
      [[ -x $bin ]] || lmscale_die "no lmscale executable at '$bin' (build it, or set LMSCALE_BIN)"
    else
      command -v "$bin" >/dev/null || lmscale_die "no '$bin' on the PATH (build lmscale, set LMSCALE_BIN, or load its module in LMSCALE_ENV)"
    fi
  fi
  if [[ -n $LMSCALE_OUTDIR ]]; then
    mkdir -p "$LMSCALE_OUTDIR" || lmscale_die "cannot create $LMSCALE_OUTDIR"
    local stem; stem=$(basename "$LMSCALE_DECK"); stem=${stem%.*}
    lmscale_default run.output "$LMSCALE_OUTDIR/$stem-$tag.h5"
  fi
  local cmd=("${prefix[@]}" "$bin" "$LMSCALE_DECK" "${LMSCALE_OVERRIDES[@]}")
  local ntasks; ntasks=$(lmscale_ntasks "$@")

  echo "== lmscale job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_TASK_ID:+ (array ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})} on ${SLURM_JOB_NODELIST:-$(hostname -s)}"
  echo "   nodes ${SLURM_JOB_NUM_NODES:-1}, tasks $ntasks, cpus/task ${SLURM_CPUS_PER_TASK:-1}, gpus/node ${SLURM_GPUS_ON_NODE:-0}, $(date -u +%FT%TZ)"
  echo "   repository ${LMSCALE_ROOT:-?}"
  echo "   ${cmd[*]}"
  echo "== resolved configuration"
  # One process checks the deck for the job's world size (dp*tp*pp against the task count), so a
  # bad deck exits 2 here without starting any rank.
  "${cmd[@]}" --print-config --world-size="$ntasks"
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "lmscale job: --print-config failed (exit $rc; 2 = bad deck), not launching" >&2
    return "$rc"
  fi
  local srun_cmd=(srun "${srun_args[@]}" ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} "$@")
  echo "== run: ${srun_cmd[*]} ${cmd[*]}"
  # srun does not inherit --cpus-per-task in 22.05: pass it on. When one rank fails, the pmix
  # plugin ends the step and srun reports the others' signal (137/143) as its exit code, which
  # would hide lmscale's 1 or 2: take the code from srun's "Exited with exit code N" lines then.
  local errf; errf=$(mktemp "${TMPDIR:-/tmp}/lmscale-srun.XXXXXX")
  { "${srun_cmd[@]}" "${cmd[@]}" \
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
