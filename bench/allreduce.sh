#!/usr/bin/env bash
# bench/allreduce.sh [BUILD_DIR]: the all-reduce micro-benchmark (docs/explanation/communication.md):
# MPI, 2 ranks (PD_COMM_BENCH_NP to change), a 64 MB buffer (PD_COMM_BENCH_MB), the old chain
# (chain reduce + broadcast) vs the ring (comm_group_allreduce) vs MPI_Allreduce: median time,
# GB/s and the bytes each rank sent. It is test_comm_mpi in benchmark mode (it re-launches
# itself under mpirun, root allowed). Build first:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target test_comm_mpi
set -euo pipefail
build=${1:-build}
exe="$build/test_comm_mpi"
[ -x "$exe" ] || { echo "bench/allreduce.sh: $exe not found (build the test_comm_mpi target)" >&2; exit 2; }
. "$(dirname "$0")/lib/result.sh"     # the figures also go to bench/results/
result_start allreduce "$@"
PD_COMM_BENCH=allreduce "$exe"
result_finish
