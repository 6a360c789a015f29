#!/usr/bin/env bash
# The whole trainer on a GPU in one call of a few minutes, and a short report of it.
#
#   bash tests/gpu/gpu_check.sh [OUT]            # on a GPU machine: ~1.3B Llama, seq_len 32,768, bf16
#   GPU_CHECK_CPU=1 bash tests/gpu/gpu_check.sh OUT   # the same steps on CPU with a tiny model (its test)
#
# Steps, each logged under OUT (default runs/gpu-check):
#   1. pytest tests/gpu                      (block-causal attention, DPO, FSDP2 on CUDA; skipped on CPU)
#   2. packfeed pack on the driver, no Ray   (a corpus of long documents made from the bundled one)
#   3. torchrun ... packfeed train --launcher torchrun on the packed rows: FSDP2, full activation
#      checkpointing, the chunked loss, varlen (or flash-attn-4) attention, bf16
#   4. bench/bench_memory.py                 (the same model: memory and tokens/s per layout)
#   5. OUT/report.md                         (tokens/s, MFU, peak memory, packed vs padded, the losses)
# Needs torch and transformers and packfeed's own dependencies, not Ray (`packfeed train
# --launcher torchrun` does not import it; the pack of a small corpus runs on the driver).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-runs/gpu-check}"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
BIN="$(dirname "$PY")"
PACKFEED="${PACKFEED:-$BIN/packfeed}"
TORCHRUN="${TORCHRUN:-$BIN/torchrun}"
mkdir -p "$OUT"
rm -rf "${OUT:?}/packed" "${OUT:?}/train"

if [ -n "${GPU_CHECK_CPU:-}" ]; then
    SEQ=512; NPROC=2; STEPS=6; ATTN=sdpa; PRECISION=fp32; DOCS=300; BENCH="--seq-len 512 --steps 1 --vocab 8192 --only fsdp-full-chunked"
    MODEL='overrides = { hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2 }'
    export OMP_NUM_THREADS=1
else
    SEQ=32768; NPROC="${NPROC:-$(nvidia-smi -L | wc -l)}"; STEPS=20; ATTN="${ATTN:-varlen}"; PRECISION=bf16
    DOCS=3000; BENCH="--device cuda"
    MODEL='overrides = { hidden_size = 2048, intermediate_size = 5632, num_hidden_layers = 16, num_attention_heads = 16, num_key_value_heads = 4, head_dim = 128, max_position_embeddings = 65536 }'
fi

echo "== 1. tests/gpu" | tee "$OUT/steps.log"
set +e
"$PY" -m pytest -q -n 0 -p no:cacheprovider tests/gpu > "$OUT/pytest_gpu.log" 2>&1  # one process: one GPU
GPU_TESTS=$?
set -e
tail -n 1 "$OUT/pytest_gpu.log" | tee -a "$OUT/steps.log"
[ "$GPU_TESTS" -eq 0 ] || [ "$GPU_TESTS" -eq 5 ] || { echo "tests/gpu failed (exit $GPU_TESTS)"; exit 1; }

echo "== 2. packfeed pack (driver, no Ray) of long documents" | tee -a "$OUT/steps.log"
"$PY" - "$OUT/long.jsonl" "$DOCS" "$SEQ" <<'EOF'
"""Long documents: the bundled corpus's texts joined into documents of 1/8 to 1 row each."""
import json, random, sys
from packfeed.service.assets import demo_corpus_paths
out, docs, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
texts = []
for path in demo_corpus_paths():
    for line in open(path):
        record = json.loads(line)
        texts.append(record.get("text") or " ".join(m["content"] for m in record.get("messages", [])) or
                     (record.get("prompt", "") + " " + record.get("completion", "")))
rng = random.Random(0)
with open(out, "w") as f:
    for _ in range(docs):
        words = rng.randint(seq // 8, seq)  # ~1 token a word with the bundled tokenizer: up to a row
        parts, n = [], 0
        while n < words:
            parts.append(rng.choice(texts)); n += len(parts[-1].split())
        f.write(json.dumps({"text": " ".join(" ".join(parts).split()[:words])}) + "\n")
EOF
"$PACKFEED" pack "$OUT/long.jsonl" --tokenizer service/assets/tokenizer --seq-len "$SEQ" --overlong split \
    --output "$OUT/packed" > "$OUT/pack.log" 2>&1
tail -n 3 "$OUT/pack.log" | tee -a "$OUT/steps.log"

echo "== 3. packfeed train --launcher torchrun: fsdp, full checkpointing, chunked loss, $ATTN, $PRECISION" \
    | tee -a "$OUT/steps.log"
cat > "$OUT/train.toml" <<EOF
[data]
inputs = ["$OUT/packed"]
tokenizer = "service/assets/tokenizer"
seq_len = $SEQ

[model]
name = "tiny-llama"
attn = "$ATTN"
$MODEL

[train]
max_steps = $STEPS
micro_batch_rows = 1
grad_accum = 1
lr = 3e-4
warmup_steps = 2
log_every = 1
precision = "$PRECISION"
sharding = "fsdp"
activation_checkpointing = "full"
loss_chunk_tokens = 1024

[scaling]
num_workers = $NPROC
EOF
"$TORCHRUN" --standalone --nproc-per-node "$NPROC" --no-python "$PACKFEED" train --config "$OUT/train.toml" \
    --launcher torchrun --output "$OUT/train" > "$OUT/train.log" 2>&1
tail -n 12 "$OUT/train.log" | tee -a "$OUT/steps.log"

echo "== 4. bench/bench_memory.py $BENCH" | tee -a "$OUT/steps.log"
"$PY" bench/bench_memory.py $BENCH --json "$OUT/bench_memory.json" > "$OUT/bench_memory.log" 2>&1 || true
tail -n 8 "$OUT/bench_memory.log" | tee -a "$OUT/steps.log"

echo "== 5. report" | tee -a "$OUT/steps.log"
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
summary = json.loads((out / "train" / "summary.json").read_text())
stats = json.loads((out / "packed" / ".packfeed" / "stats.json").read_text())
records = [json.loads(l) for l in (out / "train" / "metrics.jsonl").read_text().splitlines() if l.strip()]
ranks = summary.get("memory", {}).get("ranks", [])
device = "CPU"
try:
    import torch
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
except ImportError:
    pass
rows, samples = stats["rows"], stats["samples_packed"]
lines = [
    f"# packfeed GPU check on {device}", "",
    f"- tests/gpu: {(out / 'pytest_gpu.log').read_text().strip().splitlines()[-1]}",
    f"- packed: {samples:,} samples into {rows:,} rows of {stats['seq_len'] if 'seq_len' in stats else '?'} tokens, "
    f"efficiency {stats.get('efficiency', 0):.1%}; padded (one sample a row) would need {samples:,} rows: "
    f"{samples / max(rows, 1):.1f} x the rows, steps and compute",
    f"- train (torchrun, fsdp, full checkpointing, chunked loss): {summary['steps']} steps, "
    f"{summary.get('tokens_per_s', 0):,.0f} real tokens/s, MFU "
    + (f"{records[-1]['mfu']:.1%}" if records and records[-1].get("mfu") else "n/a (no GPU peak known)"),
    f"- peak memory per rank: " + ", ".join(f"{r['peak_bytes'] / 2**30:.2f} GiB" for r in ranks),
    f"- loss: " + " ".join(f"{r['loss']:.3f}" for r in records),
    "", "## bench/bench_memory.py", "", "```",
    *(out / "bench_memory.log").read_text().strip().splitlines()[-10:], "```",
]
(out / "report.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
