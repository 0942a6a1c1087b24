"""The paraphrastic sentence encoders of Wieting & Gimpel 2018 (WORD, TRIGRAM, LSTM, BLSTM, GRAN
and their combinations) as torch modules, and a trained encoder as a directory with the API the
filter and embedding jobs use (``load_encoder``)."""
