# gpt_tiny.sh: the PyTorch-oracle tests' setup (sourced after common.sh, with tmp, PY and SRC
# set): a generated text of SEED's words in $tmp/t.txt, a two-block GPT of width 32 over 16
# bytes in $tmp/gpt.json, its PyTorch twin in $tmp/twin.py, and a 4-stage plan $tmp/p4.json.
gpt_tiny_setup() {
    local seed=$1
    "$PY" - "$tmp/t.txt" "$seed" <<'PY'
import random, sys
random.seed(int(sys.argv[2]))
words = "the of and to in that he shall unto for his i a lord they be is him not them it with all".split()
with open(sys.argv[1], "w") as f:
    for _ in range(2000):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(4, 12))) + ".\n")
PY
    local B='[{"type": "layernorm", "features": 32}, {"type": "attention", "dim": 32, "heads": 2, "causal": true}],
   [{"type": "layernorm", "features": 32}, {"type": "dense", "in": 32, "out": 64}, {"type": "gelu", "approximate": "tanh"},
    {"type": "dense", "in": 64, "out": 32}]'
    cat >"$tmp/gpt.json" <<JSON
{"name": "gpt-tiny", "input": [16],
 "layers": [{"type": "embed", "vocab": 256, "dim": 32, "positions": 16},
            {"type": "block", "steps": [$B]}, {"type": "block", "steps": [$B]},
            {"type": "layernorm", "features": 32}, {"type": "dense", "in": 32, "out": 256}]}
JSON
    cat >"$tmp/twin.py" <<'PY'
import torch_models as tm
def net():
    return tm.gpt(vocab=256, ctx=16, dim=32, layers=2, heads=2, hidden=64)
PY
    plan "$tmp/p4.json" 5 gpt-tiny "0" "1" "2" "3, 4"
}
