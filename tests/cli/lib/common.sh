# common.sh: helpers shared by the CLI tests (sourced; not a test itself).
# plan FILE N_LAYERS MODEL "stage layer lists"... : a hand-written plan, one rank per stage.
plan() {
    local f=$1 nl=$2 model=$3; shift 3
    local n=$# stages="" r=0
    for st in "$@"; do
        stages="$stages${stages:+,}{\"layers\": [$st], \"replicas\": 1, \"ranks\": [$r], \"compute_s\": 1, \"time_s\": 1}"
        r=$((r + 1))
    done
    cat >"$f" <<JSON
{"format": "pipedream-plan", "version": 1, "model": "$model", "profile_crc32": "00000000", "n_layers": $nl,
 "cost_model": {"kind": "ours", "straight": true, "allow_idle": false, "memory_limit": 0,
                "activation_compression": 0, "overlap_allreduce": false},
 "cluster": {"levels": [{"workers": $n, "bandwidth": 1e10, "latency": 0}], "memory_per_worker": 0},
 "n_workers": $n, "noam": $n,
 "predicted": {"pipeline_s": 1, "single_worker_s": 1, "data_parallel_s": 1, "speedup_over_single": 1,
               "speedup_over_data_parallel": 1},
 "stages": [$stages]}
JSON
}
# crc FILE: the weights_crc list of a summary line
crc() { sed -n 's/.*"weights_crc":\[\([^]]*\)\].*/\1/p' "$1"; }
now() { date +%s.%N; }
# elapsed T0: seconds since T0
elapsed() { echo "$(now) - $1" | bc; }
