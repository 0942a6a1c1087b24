"""What an NMT model directory holds and how it is read and made: model.json, sha256 checks and
the local copy of a bucket's directory (model_dir.py); fairseq checkpoints loaded with their
configs validated and nothing unpickled that could run code (checkpoint.py); the text pipeline of
a model direction (tokenization.py); fairseq's command-line tools run on such checkpoints
(fairseq_compat.py); transformers models converted to CTranslate2 (transformers_import.py);
fairseq imported without the scikit-learn it loads for code never run here (fairseq_import.py).
Imports nothing else of models/nmt."""
