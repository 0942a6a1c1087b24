"""Semantic divergences in parallel text without annotations (Vyas, Niu & Carpuat 2018).

    det = load_divergence_detector("runs/divergence-en-fr")
    p = det.score(["can you help him , sir ?"], ["pouvez-vous l'aider , monsieur ?"])   # P(equivalent)
    det.divergent(english, french)            # bool array: P(equivalent) < the tuned threshold

No divergence labels are needed to train. A parallel corpus gives the positives (its pairs, taken
as equivalent); the negatives are cross pairs (e_i, f_j), i != j, that look like translations on
the surface: length ratio at most 2, and at least half of the words of EACH side have a
translation in the other side according to a bilingual dictionary made from word alignments
(both directions, every aligned word pair as in the authors' code, SemDiverge). The aligner is
fast_align's model (models/bitext/word_align.py), which has no randomness, so a training is
reproducible with its seed; eflomal (``aligner="eflomal"``) aligns from samplers that seed
themselves and cannot be reproduced. ``aligner="agreement"`` (both directions trained together)
aligns as well as eflomal but gave a worse detector on subtitles: its dictionary is a quarter of
fast_align's, and the negatives and word vectors made from it suffer (docs/benchmarks.md). Five
negatives per positive, sampled with a seeded generator, and (``partial_negatives``, default 1) a
partial divergence of the positive itself: a span of one side deleted, replaced or added
(:func:`partial_divergence`, after Briakou & Carpuat 2020). The cross pairs alone teach only
"unrelated"; the labelled divergences are mostly a clause missing or added on one side, and with
one partial negative a positive the detector's commoncrawl F1 rose from 76.8 to 80.6 (mean of 5
seeds; ROC AUC 0.873 -> 0.907), opensubs level (69.2 -> 68.8, AUC 0.747 -> 0.758); two per
positive did worse on commoncrawl (75.3).

The weights kept are the mean of the weights after every step of the last epoch
(``average_epochs``, stochastic weight averaging with the constant learning rate): the last step's
are one noisy point of the path. Over 5 seeds the commoncrawl ROC AUC spread 0.893-0.917 instead
of 0.877-0.960 and the opensubs AUC rose 0.758 -> 0.785, the F1 means level (docs/benchmarks.md).

A detector is an ensemble (``DivergenceConfig.members``, default 2): the interaction model trained
from several seeds on the same dictionary and vectors, P(equivalent) the mean of the members'. One
seed's dev figures spread widely; two members with weight averaging reached commoncrawl macro F1
>= 80 and ROC AUC >= 0.919 in every one of five seeds (one member: F1 >= 80 in two, AUC 0.893-0.917)
and kept opensubs level (docs/benchmarks.md), at twice the cost of training and scoring one;
``members=1`` is the cheaper detector.

The classifier is He & Lin's (2016) pairwise word-interaction model, as Vyas et al. use it:
bilingual word embeddings -> one BiLSTM (shared by both languages) -> a similarity cube (cosine,
scaled L2 distance and scaled dot product of the forward, backward, concatenated and summed
states of every word pair) -> a focus layer (a greedy one-to-one matching of the strongest
interactions keeps weight 1, the rest gets 0.1) -> a small deep CNN (conv + max-pool blocks, a
global max-pool, dense layers) -> P(equivalent). One channel is added to the cube: whether the
two words are the same string: names and numbers are often out of vocabulary, and a copied name
is evidence of a translation that no embedding can give for an unknown word.

Embeddings: two tables (one per language) in one space, initialised from the parallel data:
the English x French matrix of alignment-link counts (both directions), square-rooted and
factored by a truncated SVD, English words = U sqrt(S), French words = V sqrt(S), rows
normalised (see :func:`svd_embeddings` for why square roots). Two tables rather than one joint
vocabulary because the same string is often a different word in the two languages ("a", "on",
"est"). The dot product of the two factors approximates how often two words are aligned, so
translations start close together, rather than the model having to discover translations from
the synthetic task alone (which asks for it only indirectly). The same
vectors give the embedding-cosine baseline. They are kept fixed by default: fine-tuning them on
the synthetic task did not help on the development sets (ROC AUC 0.87 either way on
commoncrawl, 0.78 -> 0.73 on opensubs, one epoch; the synthetic held-out accuracy dropped too):
it moves the training vocabulary away from the words it never sees, 12-18% of the development
tokens. ``embeddings="random"`` learns them end to end instead.

The decision threshold on P(equivalent) is tuned for macro F1 on development data with labels
(:func:`tune_threshold`). Baselines of the paper: :func:`embedding_cosine_scores` and
:func:`length_ratio_scores`, thresholded the same way.

The package, by concern (each module's docstring says more):

    lexicon.py     tokenize; word alignments (fast_align, agreement, eflomal); the bilingual dictionary
    negatives.py   the synthetic examples: cross pairs and partial divergences of the positives
    baselines.py   bilingual word vectors (SVD of the alignment counts); the cosine and length baselines
    metrics.py     macro F1, threshold tuning, the labelled development files
    model.py       the interaction model and the ensemble of its seeds
    config.py      DivergenceConfig: sizes and training settings
    detector.py    DivergenceDetector: scoring, its model directory, load_divergence_detector
    training.py    train_divergence: from a parallel corpus to a detector
"""

from models.bitext.divergence.baselines import BilingualEmbeddings, embedding_cosine_scores, length_ratio_scores
from models.bitext.divergence.config import MAX_MEMBERS, DivergenceConfig
from models.bitext.divergence.detector import DivergenceDetector, load_divergence_detector
from models.bitext.divergence.lexicon import ALIGNERS, tokenize, word_alignments
from models.bitext.divergence.metrics import macro_f1, read_dev_tsv, tune_threshold
from models.bitext.divergence.training import TrainedDivergence, train_divergence

__all__ = ["ALIGNERS", "MAX_MEMBERS", "BilingualEmbeddings", "DivergenceConfig", "DivergenceDetector",
           "TrainedDivergence", "embedding_cosine_scores", "length_ratio_scores", "load_divergence_detector",
           "macro_f1", "read_dev_tsv", "tokenize", "train_divergence", "tune_threshold", "word_alignments"]
