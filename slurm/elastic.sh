# The elastic restart of slurm/train_elastic.sbatch (sourced after common.sh, not run). Bash.
#
# Provides:
#   lmscale_elastic_plan NODES TASKS_PER_NODE TP PP BATCH MICRO
#       the layout on NODES nodes that keeps the global batch BATCH and the micro-batch MICRO
#       (sequences per rank per forward): prints "WORLD DP ACCUM" (ACCUM: micro-batches per rank
#       and step, train.grad_accum, or parallel.microbatches when PP > 1); or prints why not to
#       stderr and returns 2 (no model replica fits, or BATCH does not split into DP x MICRO).
#   lmscale_elastic_shape WORLD
#       the deck's layout for WORLD ranks (lmscale --print-config): sets ELASTIC_TP, ELASTIC_PP,
#       ELASTIC_DP, ELASTIC_BATCH, ELASTIC_ACCUM, ELASTIC_ACCUM_KEY and ELASTIC_MICRO; returns
#       lmscale's exit code (2: the deck does not fit WORLD ranks).
#   lmscale_elastic_job_nodes JOB
#       the nodes Slurm still counts in the job's allocation, one a line (a node that fails in a
#       job submitted with --no-kill is taken out of it).
#   lmscale_elastic_remaining JOB WAIT_S NODE...
#       waits (WAIT_S seconds at most) until Slurm reports one of NODE... lost: taken out of the
#       job, or down, failing, drained or not responding. Prints the NODEs left, one a line, and
#       returns 0; returns 1 when none was lost in that time (the failure was not a lost node).
#   lmscale_elastic_wait_default
#       the default WAIT_S: twice the cluster's SlurmdTimeout plus 10 s (slurmctld marks a node
#       down SlurmdTimeout after its last answer to a ping, sent every SlurmdTimeout / 3).

lmscale_elastic_plan() {  # NODES TASKS_PER_NODE TP PP BATCH MICRO
  local nodes=$1 tpn=$2 tp=$3 pp=$4 batch=$5 micro=$6
  local world=$((nodes * tpn)) replica=$((tp * pp))
  if (( world < replica )); then
    echo "$nodes node(s) x $tpn task(s) = $world rank(s) cannot hold one model replica of parallel.tp x parallel.pp = $tp x $pp = $replica ranks; resubmit on at least $(( (replica + tpn - 1) / tpn )) node(s)" >&2
    return 2
  fi
  if (( world % replica != 0 )); then
    echo "$nodes node(s) x $tpn task(s) = $world rank(s) is not a multiple of parallel.tp x parallel.pp = $replica; use --ntasks-per-node a multiple of $replica, or resubmit" >&2
    return 2
  fi
  local dp=$((world / replica))
  if (( batch % (dp * micro) != 0 )); then
    echo "train.batch_size = $batch does not split into $dp data-parallel rank(s) x micro-batches of $micro sequence(s): the global batch cannot be kept on $nodes node(s); choose train.batch_size a multiple of $micro x every data-parallel degree the job may shrink to (here $((dp * micro)))" >&2
    return 2
  fi
  echo "$world $dp $((batch / (dp * micro)))"
}

lmscale_elastic_shape() {  # WORLD
  local text rc
  lmscale_prepare   # here, not in the command substitution below: it sources LMSCALE_ENV
  text=$(lmscale_resolved_config "$1")
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "lmscale job: the deck does not fit $1 rank(s) (lmscale --print-config exit $rc)" >&2
    return "$rc"
  fi
  ELASTIC_TP=$(lmscale_config_value "$text" parallel tp)
  ELASTIC_PP=$(lmscale_config_value "$text" parallel pp)
  ELASTIC_DP=$(lmscale_config_value "$text" parallel dp)
  ELASTIC_BATCH=$(lmscale_config_value "$text" train batch_size)
  # A pipeline accumulates over parallel.microbatches (train.grad_accum is 1 with pp).
  if (( ELASTIC_PP > 1 )); then
    ELASTIC_ACCUM_KEY=parallel.microbatches ELASTIC_ACCUM=$(lmscale_config_value "$text" parallel microbatches)
  else
    ELASTIC_ACCUM_KEY=train.grad_accum ELASTIC_ACCUM=$(lmscale_config_value "$text" train grad_accum)
  fi
  ELASTIC_MICRO=$((ELASTIC_BATCH / (ELASTIC_DP * ELASTIC_ACCUM)))
}

lmscale_elastic_job_nodes() {  # JOB
  local list
  list=$(scontrol --oneliner show job "$1" 2>/dev/null | sed -n 's/.* NodeList=\([^ ]*\).*/\1/p' | head -n 1)
  [[ -n $list && $list != "(null)" ]] && scontrol show hostnames "$list"
}

# A node the job should no longer use: sinfo's short state down, drain(ing), fail(ing) or maint,
# or any state marked '*' (not responding).
_lmscale_elastic_node_lost() {  # NODE
  local st
  st=$(sinfo -h -N -n "$1" -o %t 2>/dev/null | head -n 1)
  [[ -z $st || $st == *'*' || $st =~ ^(down|drain|drng|drained|fail|failg|maint) ]]
}

lmscale_elastic_remaining() {  # JOB WAIT_S NODE...
  local job=$1 wait_s=$2; shift 2
  local deadline=$((SECONDS + wait_s)) n in_job left
  while :; do
    in_job=" $(lmscale_elastic_job_nodes "$job" | tr '\n' ' ') "
    left=()
    for n in "$@"; do
      [[ $in_job == *" $n "* ]] && ! _lmscale_elastic_node_lost "$n" && left+=("$n")
    done
    if (( ${#left[@]} < $# )); then
      printf '%s\n' "${left[@]}"
      return 0
    fi
    (( SECONDS >= deadline )) && return 1
    sleep 2
  done
}

lmscale_elastic_wait_default() {
  local t
  t=$(scontrol show config 2>/dev/null | sed -n 's/^SlurmdTimeout *= *\([0-9]*\).*/\1/p')
  echo $(( 2 * ${t:-300} + 10 ))
}
