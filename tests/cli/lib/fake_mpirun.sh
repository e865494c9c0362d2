#!/usr/bin/env bash
# fake_mpirun.sh: an mpirun for launch's tests that need no cluster (not a test itself). A probe
# (`... true`) touches $FAKE_DIR/probing and sleeps $FAKE_PROBE_S (default 0); a train command
# records its arguments ($FAKE_DIR/argv-N, one a line) and open descriptors ($FAKE_DIR/fds-N),
# then plays $FAKE_MODE on stderr (the lines `pipedream train` prints) and stdout (a summary):
#   ok           training, checkpoint 50 (the file made), $FAKE_SLEEP s, the summary, exit 0
#   fail_once    first run: rank 1's error line, checkpoint 50, rank 0 stopping on a signal,
#                exit 1; resumed: training, the summary, exit 0
#   silent       exit 1 at once, printing nothing
#   fail_early   first run: training, 1 s, rank 1 ending the job (abort) before any checkpoint,
#                rank 0 stopping on a signal, exit 1; resumed: training, the summary
#   hang         training, then waits on a sleeping child (pid in $FAKE_DIR/sleeper)
#   grandchild   leaves a sleeping process holding its stderr (pid in $FAKE_DIR/sleeper), the
#                summary, exit 0
#   notfound     exit 127 at once, as mpirun does when a program it runs is missing
#   chunks2      two checkpoints, each with a --progress-file line of 2 ranks running 2 chunks
#                each as predicted (compute twice one stage's prediction), the summary
#   straggler    as chunks2 with one chunk, rank 1 computing 5 times its prediction
# A link probe (launch --link-probe) prints 1e9 (bytes/s).
for a in "$@"; do
    [ "$a" = true ] && { touch "$FAKE_DIR/probing"; sleep "${FAKE_PROBE_S:-0}"; exit 0; }
    [ "$a" = --link-probe ] && { echo 1e9; exit 0; }
done
n=$(ls "$FAKE_DIR" | grep -c '^argv-')
printf '%s\n' "$@" >"$FAKE_DIR/argv-$n"
ls -l /proc/$$/fd >"$FAKE_DIR/fds-$n" 2>/dev/null
ck= resume=0 prev= progress=
for a in "$@"; do
    [ "$prev" = --checkpoint-dir ] && ck=$a
    [ "$prev" = --progress-file ] && progress=$a
    [ "$a" = --resume ] && resume=1
    prev=$a
done
training() { echo "pipedream: training lenet5 with 1f1b on 2 workers (2 stages), ${FAKE_MB:-100} minibatches of 32 samples" >&2; }
checkpoint() { mkdir -p "$ck" && touch "$ck/ckpt-0000000050.safetensors"; echo "pipedream: checkpoint $ck/ckpt-0000000050.safetensors" >&2; }
summary() { echo '{"model":"lenet5","steps":100,"weights_crc":["0"]}'; }
case ${FAKE_MODE:-ok} in
    ok) training; sleep 0.2; checkpoint; sleep "${FAKE_SLEEP:-0}"; summary ;;
    fail_once)
        training
        if [ $resume = 0 ]; then
            sleep 0.3; echo "pipedream: error: rank 1 (stage 1): a made-up failure" >&2
            sleep 0.3; checkpoint
            sleep 0.5; echo "pipedream: rank 0 (stage 0): stopping on signal 15: the job is ending (a rank failed or mpirun was interrupted); last checkpoint to resume from: none" >&2
            exit 1
        fi
        summary ;;
    silent) exit 1 ;;
    fail_early)
        training
        if [ $resume = 0 ] && [ ! -f "$FAKE_DIR/failed" ]; then
            touch "$FAKE_DIR/failed"
            sleep 1; echo "pipedream: rank 1: abort: rank 1 (stage 1): a made-up failure; last checkpoint to resume from: none" >&2
            echo "pipedream: rank 0 (stage 0): stopping on signal 15: the job is ending (a rank failed or mpirun was interrupted); last checkpoint to resume from: none" >&2
            exit 1
        fi
        summary ;;
    hang) training; sleep 60 & echo $! >"$FAKE_DIR/sleeper"; wait ;;
    grandchild) sleep 60 & echo $! >"$FAKE_DIR/sleeper"; training; summary ;;
    notfound) exit 127 ;;
    chunks2|straggler)
        training
        r='"units":50,"compute_ms_per_unit":2.0,"wait_ms_per_unit":0.2,"busy_ms_per_unit":2.0,"bytes_per_unit":1000,"predicted_ms_per_unit":1.0,"predicted_busy_ms_per_unit":1.01'
        r1=$r
        [ "$FAKE_MODE" = straggler ] && r='"units":50,"compute_ms_per_unit":1.0,"wait_ms_per_unit":0.2,"busy_ms_per_unit":1.0,"bytes_per_unit":1000,"predicted_ms_per_unit":1.0,"predicted_busy_ms_per_unit":1.01' &&
            r1='"units":50,"compute_ms_per_unit":5.0,"wait_ms_per_unit":0.2,"busy_ms_per_unit":5.0,"bytes_per_unit":1000,"predicted_ms_per_unit":1.0,"predicted_busy_ms_per_unit":1.01'
        for mb in 50 100; do
            sleep 0.3
            echo "{\"minibatches\":$mb,\"ranks\":[{\"rank\":0,\"stage\":0,$r},{\"rank\":1,\"stage\":1,$r1}]}" >>"$progress"
            mkdir -p "$ck" && touch "$ck/ckpt-0000000$mb.safetensors"
            echo "pipedream: checkpoint $ck/ckpt-0000000$mb.safetensors" >&2
        done
        sleep 1; summary ;;
esac
exit 0
