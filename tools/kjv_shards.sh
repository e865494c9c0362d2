#!/usr/bin/env bash
# kjv_shards.sh [OUT]: the King James Bible as BPE token shards, the example of docs/howto/own-data.md:
# a 4,096-token byte-level BPE learnt on the text (tools/bpe.py train), the text encoded into
# OUT/kjv_train.bin and OUT/kjv_val.bin (the last 5% held out) with OUT/tokenizer.json beside
# them, and OUT/gpt-mini-4096.json, models/gpt-mini.json with that vocabulary. OUT defaults to
# out/kjv-bpe4096; the text comes from tools/prepare_kjv.sh. Does nothing when OUT is complete.
#   pipedream train OUT/gpt-mini-4096.json --tokens OUT --steps 200 --minibatch 32 --optimizer adam --lr 1e-3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-out/kjv-bpe4096}
vocab=${VOCAB:-4096}
if [ -s "$out/kjv_train.bin" ] && [ -s "$out/kjv_val.bin" ] && [ -s "$out/tokenizer.json" ] &&
   [ -s "$out/gpt-mini-$vocab.json" ]; then
    echo "$out"
    exit 0
fi
mkdir -p "$out"
text=$("$here/prepare_kjv.sh" "$(dirname "$out")/kjv.txt")
python3 "$here/bpe.py" train "$text" --vocab "$vocab" --out "$out/tokenizer.json.new"
python3 "$here/bpe.py" encode "$text" --tokenizer "$out/tokenizer.json.new" --out "$out" --name kjv
python3 "$here/bpe.py" model "$here/../models/gpt-mini.json" --tokenizer "$out/tokenizer.json" \
    --out "$out/gpt-mini-$vocab.json"
rm -f "$out/tokenizer.json.new"
echo "$out"
