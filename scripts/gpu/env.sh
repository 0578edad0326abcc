# Sourced by the scripts in scripts/gpu/: the environment every GPU run of lmscale needs.
#   BUILD        the build folder (default build)
#   MPIRUN       the MPI launcher (default mpirun); MPIRUN_FLAGS its flags (default, Open MPI:
#                --bind-to none -x NCCL_NVLS_ENABLE=0; MPICH: -genv NCCL_NVLS_ENABLE 0)
# NVLink multicast (NVLS) stays off: lmscale does not use it, and on hosts whose GPUs are shared
# with other jobs it can fail or hang (docs/architecture.md §3).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export BUILD=${BUILD:-build}
if [[ $(declare -p MPIRUN 2>/dev/null) != "declare -a"* ]]; then
  read -r -a MPIRUN <<< "${MPIRUN:-mpirun} ${MPIRUN_FLAGS:---bind-to none -x NCCL_NVLS_ENABLE=0}"
fi
