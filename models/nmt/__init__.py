"""Translation engines for the generation job: a fairseq transformer (or an ensemble of them)
behind one interface that samples under per-request banned words, beam-searches and scores;
checkpoint safety (configs validated before fairseq builds anything), model directories (local or
in a bucket, checked by sha256), training (``paragen-train-nmt``) and the decoder internals
(prefix-shared sampling, prepacked oneDNN products, blocked top-k)."""
