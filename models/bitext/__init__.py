"""Models of the bitext itself, used to clean it before back-translation and to score rows: the
bilingual sentence encoder and MLP pair classifier of Kim et al. 2019, the semantic-divergence
detector of Vyas et al. 2018, similarities (cosine, CSLS, margins, faiss mining) and
sentence-alignment recovery (``paragen-align``)."""
