"""What runs a model directory behind models/nmt/engine.py's interface: the fairseq engine
(fairseq_engine.py: a transformer or an ensemble, decoding through models/nmt/decoding/), the
CTranslate2 engine (ct2_engine.py), and load_engine (loading.py: the engine a directory's
model.json names, loaded once per process)."""
