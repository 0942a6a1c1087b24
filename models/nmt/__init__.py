"""Translation for the generation job: models behind one interface that samples under per-request
banned words, beam-searches and scores, and the files those models come in. By concern:

    engine.py       the interface the job decodes through (SampleRequest, Hypothesis, Engine)
    devices.py      the device a process decodes on: its GPU, precisions, step modes, batch sizes,
                    device errors
    decoding/       how tokens are chosen, on the model's device: top-k sampling under banned
                    phrases (sampler, fixed_sampler, fixed_step, prefix_decoder, bans, device_random),
                    beam search, ensembles, top-k and oneDNN products, round-trip counting
    engines/        what runs a model directory: the fairseq engine, CTranslate2, and load_engine
                    (which of the two a directory names)
    model_files/    what a model directory holds and how it is read: model.json and sha256 checks,
                    checkpoints loaded without running code, tokenization, fairseq's CLI made safe,
                    transformers (OPUS-MT, NLLB, M2M-100) converted
    train.py        paragen-train-nmt: the two models from a bitext, and their BLEU
    importing.py    paragen-import-model: a model directory from the models users have
    translate.py    paragen-translate: a model directory tried on a few lines

Layers, lowest first: model_files; engine and devices; decoding; engines; the three commands.
"""
