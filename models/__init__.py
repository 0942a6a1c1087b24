"""Model code, in three subpackages that never import one another, on one safe loader:

- ``models.nmt``: the translation engines the generation job decodes with (fairseq models, their
  checkpoints, tokenization, training and import);
- ``models.bitext``: the bitext models of the filtering papers (Kim et al. 2019 bilingual sentence
  embeddings and their MLP pair classifier, Vyas et al. 2018 divergence detection, similarity and
  alignment recovery);
- ``models.sentence``: the paraphrastic sentence encoders of the ParaNMT papers (WORD, TRIGRAM,
  LSTM, BLSTM, GRAN);
- ``models.safety``: loading model files without running what is in them (weights-only
  unpickling, checked model directories), which every subpackage uses.
"""
