#!/usr/bin/env bash
# Install everything, train two tiny NMT models on the bundled example and run the generation job.
# The tiny models show the mechanics only; paraphrase quality needs a real corpus (see docs/benchmarks.md, 'The Multi30k models').
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
PY=.venv/bin/python
MODELS=runs/example-models
if [ ! -f "$MODELS/cs-en/model.pt" ] || [ ! -f "$MODELS/en-cs/model.pt" ]; then
  echo "== training tiny cs->en and en->cs models on examples/cs-en.example.tsv (a few minutes on 2 cores)"
  $PY -m models.nmt.train --tsv examples/cs-en.example.tsv --src_lang cs --tgt_lang en --output "$MODELS" \
      --vocab_size 800 --layers 2 --dim 128 --ffn_dim 256 --heads 4 --max_epoch 10 --max_tokens 1024 \
      --lr 0.002 --dropout 0.1 --valid_size 200 --bleu_samples 200
fi
echo "== generation job (DirectRunner, preset parabank2-cpu) on the first 600 example lines"
mkdir -p runs
head -n 600 examples/cs-en.example.tsv > runs/example-input.tsv
$PY -m beam_pipelines.generate --input runs/example-input.tsv --output runs/example-output \
    --forward_model "$MODELS/cs-en" --backward_model "$MODELS/en-cs" --preset parabank2-cpu \
    --overwrite --runner DirectRunner
$PY - <<'PYEOF'
from common import storage
from paracorpus.commit import committed_files
rows = storage.parquet_dataset(committed_files("runs/example-output", "paraphrases")).to_table().to_pylist()
rows.sort(key=lambda r: (r["pair_id"], r["rank"]))
print("\nexample rows (reference -> paraphrase, rank, combined score, banned words):")
for r in rows[:12]:
    print(f"  {r['reference']}\n    -> {r['paraphrase']}  (rank {r['rank']}, {r['combined_score']:.2f}, "
          f"banned {r['constraint_set']})")
PYEOF
echo
echo "Note: these models were trained for a few minutes on synthetic sentences. They show how the"
echo "job works, not the quality of its paraphrases: train on a real corpus for that (docs/benchmarks.md, 'The Multi30k models')."
