"""Paraphrastic sentence embeddings (Wieting & Gimpel 2017, 2018): data, training, STS, lexicon.

The encoders themselves (torch modules, save/load) live in models/sentence/encoders.py and
models/sentence/sentence_encoder.py; this package holds what trains and evaluates them.
"""
