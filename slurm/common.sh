# Shared by the slurm/*.sbatch job scripts (sourced, not run). Bash.
#
# Provides:
#   lmscale_parse_args ARGS...   positional DECK and OUTDIR (or env DECK / OUTDIR), --section.key=value
#                                overrides; sets LMSCALE_DECK, LMSCALE_OUTDIR, LMSCALE_OVERRIDES
#   lmscale_default KEY VALUE    adds --KEY=VALUE unless the user already overrode KEY
#   lmscale_set KEY VALUE        --KEY=VALUE in place of any override of KEY (the job's own choice)
#   lmscale_prepare              sources LMSCALE_ENV and finds the executable (once per shell); sets
#                                LMSCALE_CMD = (prefix... lmscale DECK overrides...)
#   lmscale_resolved_config N    `lmscale DECK overrides --print-config --world-size=N` (stdout);
#                                lmscale's exit code (2: the deck does not fit N ranks)
#   lmscale_config_value TEXT SECTION KEY
#                                KEY's value in SECTION of a resolved configuration TEXT
#   lmscale_launch TAG [srun options...]
#                                prints the job header and `lmscale DECK --print-config --world-size=N`
#                                (the deck checked, as one process, for the N tasks of the job), then
#                                runs `srun lmscale DECK overrides` and returns its exit code.
#                                With OUTDIR set, the results go to OUTDIR/<deck stem>-TAG.h5.
# and for training jobs that checkpoint and continue (train_requeue.sbatch, train_elastic.sbatch):
#   lmscale_resumable JOB        train.checkpoint_dir = OUTDIR/checkpoints-JOB and train.resume = auto
#                                unless overridden; OMP_NUM_THREADS; USR1 (the time limit is near)
#                                passed on to the ranks, SIGTERM (preemption) left to Slurm
#   lmscale_launch_stoppable TAG [srun options...]
#                                lmscale_launch in the background, so that those signals are handled
#                                while the ranks run; returns its exit code
#   lmscale_requeue_if_stopped RC
#                                RC = 75 after USR1: `scontrol requeue` the job (it continues from its
#                                checkpoint when Slurm starts it again)
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

lmscale_set() {  # KEY VALUE (lmscale refuses a key given twice on its command line)
  local a kept=()
  for a in "${LMSCALE_OVERRIDES[@]}"; do [[ $a == "--$1="* ]] || kept+=("$a"); done
  LMSCALE_OVERRIDES=("${kept[@]}" "--$1=$2")
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

lmscale_prepare() {
  [[ -n ${LMSCALE_PREPARED:-} ]] && return 0
  if [[ -n ${LMSCALE_ENV:-} ]]; then
    [[ -r $LMSCALE_ENV ]] || lmscale_die "LMSCALE_ENV=$LMSCALE_ENV: no such readable file (a bash file of module loads, or unset it)" 2
    # shellcheck disable=SC1090
    source "$LMSCALE_ENV" || lmscale_die "sourcing LMSCALE_ENV=$LMSCALE_ENV failed"
  fi
  LMSCALE_PREFIX_WORDS=()
  read -r -a LMSCALE_PREFIX_WORDS <<<"${LMSCALE_LAUNCH_PREFIX:-}"
  LMSCALE_EXE=${LMSCALE_BIN:-$(lmscale_default_bin)}
  if [[ ${#LMSCALE_PREFIX_WORDS[@]} -eq 0 ]]; then
    if [[ $LMSCALE_EXE == */* ]]; then
      [[ -x $LMSCALE_EXE ]] || lmscale_die "no lmscale executable at '$LMSCALE_EXE' (build it, or set LMSCALE_BIN)"
    else
      command -v "$LMSCALE_EXE" >/dev/null || lmscale_die "no '$LMSCALE_EXE' on the PATH (build lmscale, set LMSCALE_BIN, or load its module in LMSCALE_ENV)"
    fi
  fi
  LMSCALE_PREPARED=1
  lmscale_command
}

lmscale_command() {  # LMSCALE_CMD from the overrides as they are now
  LMSCALE_CMD=("${LMSCALE_PREFIX_WORDS[@]}" "$LMSCALE_EXE" "$LMSCALE_DECK" "${LMSCALE_OVERRIDES[@]}")
}

lmscale_resolved_config() {  # N
  lmscale_prepare
  lmscale_command
  "${LMSCALE_CMD[@]}" --print-config --world-size="$1"
}

lmscale_config_value() {  # TEXT SECTION KEY
  awk -v sec="[$2]" -v key="$3" '
    /^\[/ { in_sec = ($0 == sec); next }
    in_sec && index($0, "=") { k = $0; sub(/ *=.*/, "", k); if (k == key) { v = $0; sub(/^[^=]*= */, "", v); print v; exit } }' <<<"$1"
}

lmscale_launch() {  # TAG [srun options...]
  local tag=$1; shift
  lmscale_prepare
  local srun_args=()
  read -r -a srun_args <<<"${LMSCALE_SRUN_ARGS:-}"
  [[ -n ${LMSCALE_SRUN_MPI:-} ]] && srun_args=("--mpi=$LMSCALE_SRUN_MPI" "${srun_args[@]}")
  if [[ -n $LMSCALE_OUTDIR ]]; then
    mkdir -p "$LMSCALE_OUTDIR" || lmscale_die "cannot create $LMSCALE_OUTDIR"
    local stem; stem=$(basename "$LMSCALE_DECK"); stem=${stem%.*}
    lmscale_default run.output "$LMSCALE_OUTDIR/$stem-$tag.h5"
  fi
  lmscale_command
  local cmd=("${LMSCALE_CMD[@]}")
  local ntasks; ntasks=$(lmscale_ntasks "$@")

  # LMSCALE_NODELIST / LMSCALE_NUM_NODES: the nodes a launch uses when not all of the job's
  # (train_elastic.sbatch after a lost node).
  echo "== lmscale job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_TASK_ID:+ (array ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})} on ${LMSCALE_NODELIST:-${SLURM_JOB_NODELIST:-$(hostname -s)}}"
  echo "   nodes ${LMSCALE_NUM_NODES:-${SLURM_JOB_NUM_NODES:-1}}, tasks $ntasks, cpus/task ${SLURM_CPUS_PER_TASK:-1}, gpus/node ${SLURM_GPUS_ON_NODE:-0}, $(date -u +%FT%TZ)"
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

# ---- training jobs that checkpoint and continue -------------------------------------------------

lmscale_resumable() {  # JOB
  LMSCALE_JOB=$1 LMSCALE_NEAR_LIMIT=0
  lmscale_default train.checkpoint_dir "${LMSCALE_OUTDIR:-outputs}/checkpoints-$1"
  lmscale_default train.resume auto
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
  trap _lmscale_on_usr1 USR1
  trap _lmscale_on_term TERM
}
_lmscale_on_usr1() {
  LMSCALE_NEAR_LIMIT=1
  echo "== USR1: the time limit is near; asking the ranks to checkpoint and stop"
  scancel --signal=USR1 "$LMSCALE_JOB"   # the job's steps (the ranks), not this shell
}
# SIGTERM (preemption, requeue, scancel) reaches the ranks from Slurm itself; this shell must only
# live on until they have written their checkpoint.
_lmscale_on_term() { echo "== SIGTERM: Slurm is stopping the job; the ranks checkpoint and exit"; }

lmscale_launch_stoppable() {  # TAG [srun options...]
  # In the background, so that the traps run while lmscale does (bash runs them between commands).
  ( trap '' TERM; lmscale_launch "$@" ) &
  local pid=$! rc
  while :; do
    wait "$pid"; rc=$?
    kill -0 "$pid" 2>/dev/null || break   # a trap interrupted the wait: wait again
  done
  return "$rc"
}

lmscale_requeue_if_stopped() {  # RC
  if [[ $1 -eq 75 && $LMSCALE_NEAR_LIMIT -eq 1 ]]; then
    echo "== requeueing job $LMSCALE_JOB to continue from its checkpoint"
    scontrol requeue "$LMSCALE_JOB"
  fi
}
