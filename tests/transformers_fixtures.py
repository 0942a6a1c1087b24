"""Tiny real Hugging Face translation models (Marian / OPUS-MT and M2M-100), built offline.

Every model here is a real transformers model of its family (MarianMTModel,
M2M100ForConditionalGeneration) with the tokenizer files its family's tokenizer class reads, as the
OPUS-MT and facebook/m2m100 releases have them, saved with ``save_pretrained`` (weights in
``model.safetensors``, never a pickled ``.bin``). Nothing is downloaded: the sentencepiece models
are trained on the test's own text and the networks are trained here with torch on the synthetic
bitext of tests/toydata.py (its canonical English renderings only, see
tests/fairseq_fixtures.toy_data: 1,460 pairs; one right answer per source, so no near-ties in the
beam). d_model 64, FFN 128, 2 heads, 1 encoder + 1 decoder layer, Adam, label smoothing 0.1,
dropout 0.1, one torch thread: a Marian model trains in about 5 s (400 steps of 32 pairs), the
M2M-100 model, which learns both directions, in about 20 s (1,200 steps). :func:`build_all` builds
all three under one ROOT in about 30-40 s on 2 cores (rebuilds are bit-identical). On their 12
held-out test sentences per direction every model gets BLEU 100 (12/12 exact) with transformers'
generate (beam 1, 4 or 5), and the best hypothesis beats the second by 0.3 or more
(length-normalised log-probability, beam 4)::

    ROOT/marian_cs_en/   config.json generation_config.json model.safetensors
                         source.spm target.spm vocab.json tokenizer_config.json
        MarianMTModel cs -> en as Helsinki-NLP/opus-mt-*: separate source and target
        sentencepiece models (BPE, 120 pieces each, trained on the Czech resp. English side), one
        shared ``vocab.json`` (``</s>`` 0, ``<unk>`` 1, the pieces of source.spm then those of
        target.spm, ``<pad>`` last: pad_token_id == decoder_start_token_id == vocab_size - 1), tied
        and shared embeddings, swish, scaled embeddings, sinusoidal positions, post-norm. As in a
        model trained by Marian and converted, the <pad> row of the embeddings is zero (the decoder
        starts from a zero embedding) and <pad> was left out of the softmax in training;
        generation_config.json has ``bad_words_ids=[[pad]]`` and ``renormalize_logits`` as the
        OPUS-MT releases do.
        Loads with ``MarianTokenizer.from_pretrained(dir)`` / AutoTokenizer (needs sacremoses).
    ROOT/marian_en_cs/   the same files, en -> cs (source.spm English, target.spm Czech): with
        marian_cs_en a generation job can run with Marian both ways.
    ROOT/m2m100/         config.json generation_config.json model.safetensors
                         sentencepiece.bpe.model vocab.json added_tokens.json tokenizer_config.json
        M2M100ForConditionalGeneration trained on cs -> en AND en -> cs (one model, both ways, as
        the real multilingual models): one joint sentencepiece model (BPE, 200 pieces), vocab.json
        in fairseq's order (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, pieces), then the
        100 language codes of M2M-100 (``__af__`` ... ``__zu__``; ``__cs__``, ``__en__`` among them)
        and 8 ``madeupword`` ids: config vocab_size = len(vocab.json) + 100 + 8, as
        facebook/m2m100_418M (128004 + 100 + 8 = 128112). The codes are listed as special tokens in
        tokenizer_config.json (``extra_special_tokens``), as the real releases list them.
    ROOT/models.json     written last: the info dicts (paths relative to ROOT), the mark of a
                         complete build (:func:`load_built`)

Each model comes with an info dict: ``path`` (the transformers directory), ``family`` ("marian" |
"m2m100"), ``src_lang``, ``tgt_lang`` (the default direction: cs -> en, en -> cs for
marian_en_cs), ``directions`` ([[src, tgt], ...]: one for Marian, both for m2m100),
``lang_codes`` ({"cs": "__cs__", "en": "__en__"} for m2m100, {} for Marian), ``tokenizer_class``,
``tokenizer_files`` (file names in ``path``), ``weights`` (["model.safetensors"]),
``test_sentences`` / ``test_references`` (12 raw held-out sources of the default direction whose
meaning occurs in no training pair, and their reference translations), ``tests``
({"cs-en": {"sentences": [...], "references": [...]}, ...}: the same per direction), and the
facts: ``vocab_size``, ``d_model``, ``ffn_dim``, ``heads``, ``layers`` ([encoder, decoder]),
``steps``, ``train`` (first/last loss, seconds).

Reference helpers (transformers itself, offline, ``local_files_only=True``)::

    reference_translate(info, sentences, beam, src_lang=None, tgt_lang=None) -> list[str]
        model.generate(num_beams=beam) (forced_bos_token_id = the target code for M2M-100),
        decoded with skip_special_tokens=True.
    reference_log_probs(info, pairs, src_lang=None, tgt_lang=None) -> list[list[float]]
        teacher-forced natural log-probabilities of each target token of (source, target) pairs:
        the target tokenized the family's way, ``</s>`` included, M2M-100's language code excluded.
        For Marian the <pad> logit is masked (-inf) as CTranslate2 drops <pad> from Marian's
        vocabulary; for M2M-100 it is not (CTranslate2 keeps <pad> in M2M-100's softmax).

CTranslate2 conventions (checked by tests/test_transformers_fixtures.py; helpers ``ct2_*``)::

    Marian:   source tokens = tokenizer's tokens, which already end in "</s>" (no language token);
              no target prefix; hypotheses are pieces only (no "</s>"), decode them with the
              tokenizer. score_batch(source, target pieces WITHOUT "</s>") appends and scores
              "</s>" itself: len(log_probs) == len(target) + 1.
    M2M-100:  source tokens = ["__cs__", pieces..., "</s>"]; target_prefix=[["__en__"]]; every
              hypothesis starts with the code (strip hyp[0], or decode with skip_special_tokens).
              score_batch(source, ["__en__", pieces...], offset=1): "</s>" appended and scored,
              the code not scored: len(log_probs) == len(pieces) + 1.

Using the models in tests (a module fixture is in tests/test_transformers_fixtures.py)::

    @pytest.fixture(scope="session")
    def transformers_models(tmp_path_factory):
        from tests.transformers_fixtures import layouts_for_tests
        return layouts_for_tests(tmp_path_factory)      # {name: info dict}

``layouts_for_tests`` honours PARAGEN_TEST_TRANSFORMERS_MODELS: a directory that holds a complete
build is reused as it is; a directory without one is built into (so the next session reuses it).
``python tests/transformers_fixtures.py DIR`` builds into DIR. Importing this module sets
HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 unless they are set.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import shutil
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
NAMES = ("marian_cs_en", "marian_en_cs", "m2m100")
MARKER = "models.json"
FORMAT_VERSION = 1
ENV_VAR = "PARAGEN_TEST_TRANSFORMERS_MODELS"

SPM_VOCAB = 120            # BPE, per language (Marian: source.spm, target.spm)
M2M_SPM_VOCAB = 200        # BPE, joint (M2M-100: sentencepiece.bpe.model)
DIM, FFN, HEADS, LAYERS = 64, 128, 2, (1, 1)
STEPS = {"marian": 400, "m2m100": 1200}
BATCH, LR, WARMUP, LABEL_SMOOTHING, DROPOUT = 32, 3e-3, 30, 0.1, 0.1
THREADS = 1                # torch threads while training (tiny models: one is fastest)
M2M_CODES = {"cs": "__cs__", "en": "__en__"}
MAX_LENGTH = 64
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


# ----------------------------------------------------------------------------------------- data

def toy_pairs() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(training pairs (cs, en), 12 held-out Czech sources, their canonical English): the data of
    tests/fairseq_fixtures.toy_data (its train and valid pairs both used for training here)."""
    from tests.fairseq_fixtures import toy_data

    train, valid, sources, refs, _ = toy_data()
    return train + valid, sources, refs


def train_sentencepiece(lines: list[str], prefix: str, vocab_size: int) -> str:
    """A BPE sentencepiece model at PREFIX.model (deterministic: one thread)."""
    import sentencepiece as spm

    text = prefix + ".train.txt"
    with open(text, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    # (unigram makes a near character-level model of this small text; BPE keeps whole words)
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
                                   num_threads=1)
    os.remove(text)
    os.remove(prefix + ".vocab")
    return prefix + ".model"


def _pieces(model: str) -> list[str]:
    """The pieces of a sentencepiece MODEL, control and unknown symbols left out."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))]


# ---------------------------------------------------------------------------------------- train

@contextlib.contextmanager
def _quiet_torch(threads: int):
    """THREADS torch threads and no transformers progress bars, restored afterwards."""
    import torch
    from transformers.utils import logging as hf_logging

    before, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if bars:
            hf_logging.enable_progress_bar()


def _train(model, examples, steps: int, seed: int, drop_logit: int | None = None) -> dict:
    """Train MODEL on EXAMPLES [(input ids, label ids)]: Adam, linear warmup then inverse square
    root, label smoothing. DROP_LOGIT (Marian's <pad>) is left out of the softmax and its row of
    the shared embeddings kept zero, as in a model trained by Marian (which has no <pad>) and
    converted to transformers."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = random.Random(seed)
    pad = model.config.pad_token_id
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / WARMUP, math.sqrt(WARMUP / (s + 1))))
    embeddings = model.get_input_embeddings().weight
    if drop_logit is not None:
        with torch.no_grad():
            embeddings[drop_logit].zero_()
    model.train()
    losses = []
    for _ in range(steps):
        batch = rng.sample(examples, BATCH)
        n, m = max(len(s) for s, _ in batch), max(len(t) for _, t in batch)
        ids = torch.tensor([s + [pad] * (n - len(s)) for s, _ in batch])
        labels = torch.tensor([t + [-100] * (m - len(t)) for _, t in batch])
        logits = model(input_ids=ids, attention_mask=(ids != pad).long(), labels=labels).logits
        if drop_logit is not None:
            keep = torch.arange(logits.shape[-1]) != drop_logit
            logits = logits[..., keep]
            labels = torch.where(labels > drop_logit, labels - 1, labels)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                               label_smoothing=LABEL_SMOOTHING)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if drop_logit is not None:
            with torch.no_grad():
                embeddings[drop_logit].zero_()
        losses.append(loss.item())
    model.eval()
    return {"first_loss": round(losses[0], 3), "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 3)}


def _fresh(out: str) -> str:
    """Empty OUT and a scratch directory beside it (returned) for the tokenizer's input files."""
    tmp = out + ".tmp"
    for path in (out, tmp):
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
    return tmp


def _dims() -> dict:
    return dict(d_model=DIM, encoder_layers=LAYERS[0], decoder_layers=LAYERS[1], encoder_ffn_dim=FFN,
                decoder_ffn_dim=FFN, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                max_position_embeddings=2 * MAX_LENGTH, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                dropout=DROPOUT, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True)


def build_marian(out: str, src: str, tgt: str, src_spm: str, tgt_spm: str, pairs, seed: int = 1) -> dict:
    """A MarianMTModel SRC -> TGT in OUT, trained on PAIRS [(src text, tgt text)]; returns the
    training stats."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    tmp = _fresh(out)
    shutil.copyfile(src_spm, os.path.join(tmp, "source.spm"))
    shutil.copyfile(tgt_spm, os.path.join(tmp, "target.spm"))
    vocab = {"</s>": 0, "<unk>": 1}          # as the OPUS-MT vocab.json files: <pad> last
    for piece in _pieces(src_spm) + _pieces(tgt_spm):
        vocab.setdefault(piece, len(vocab))
    pad = vocab["<pad>"] = len(vocab)
    with open(os.path.join(tmp, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=2)
    MarianTokenizer(os.path.join(tmp, "source.spm"), os.path.join(tmp, "target.spm"), os.path.join(tmp, "vocab.json"),
                    source_lang=src, target_lang=tgt).save_pretrained(out)
    shutil.rmtree(tmp)
    tok = MarianTokenizer.from_pretrained(out, local_files_only=True)
    config = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab), activation_function="swish",
                          pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
                          bos_token_id=0, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                          **_dims())
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    enc = tok([s for s, _ in pairs], text_target=[t for _, t in pairs])
    t0 = time.time()
    stats = _train(model, list(zip(enc["input_ids"], enc["labels"])), STEPS["marian"], seed, drop_logit=pad)
    stats["seconds"] = round(time.time() - t0, 1)
    model.generation_config = GenerationConfig(      # as the OPUS-MT releases' generation_config.json
        bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        max_length=MAX_LENGTH, num_beams=4, pad_token_id=pad, renormalize_logits=True)
    model.save_pretrained(out)
    return stats


def build_m2m100(out: str, spm_model: str, pairs, seed: int = 1) -> dict:
    """An M2M100ForConditionalGeneration in OUT trained on PAIRS [(cs, en)] both ways."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    tmp = _fresh(out)
    shutil.copyfile(spm_model, os.path.join(tmp, "sentencepiece.bpe.model"))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}      # fairseq's dictionary order
    for piece in _pieces(spm_model):
        vocab.setdefault(piece, len(vocab))
    with open(os.path.join(tmp, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=2)
    # Every language code a special token, as facebook/m2m100_418M's tokenizer_config.json lists
    # them. M2M100Tokenizer means to add them itself, but in transformers 5.24 a chained comparison
    # in its __init__ (`lang_code not in str(token) not in ...`) makes it add none: then
    # skip_special_tokens keeps "__en__", get_vocab() lacks the codes and CTranslate2's converter
    # builds a vocabulary 100 tokens shorter than the model's.
    codes = [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
    M2M100Tokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "sentencepiece.bpe.model"),
                    src_lang="cs", tgt_lang="en", additional_special_tokens=codes).save_pretrained(out)
    shutil.rmtree(tmp)
    tok = M2M100Tokenizer.from_pretrained(out, local_files_only=True)
    size = len(vocab) + len(tok.lang_code_to_id) + tok.num_madeup_words
    config = M2M100Config(vocab_size=size, activation_function="relu", pad_token_id=1, bos_token_id=0,
                          eos_token_id=2, decoder_start_token_id=2, **_dims())
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    examples = []
    for src, tgt in (("cs", "en"), ("en", "cs")):
        tok.src_lang, tok.tgt_lang = src, tgt
        a, b = (0, 1) if src == "cs" else (1, 0)
        enc = tok([p[a] for p in pairs], text_target=[p[b] for p in pairs])
        examples += list(zip(enc["input_ids"], enc["labels"]))
    t0 = time.time()
    stats = _train(model, examples, STEPS["m2m100"], seed)
    stats["seconds"] = round(time.time() - t0, 1)
    model.generation_config = GenerationConfig(      # as facebook/m2m100_418M's
        bos_token_id=0, decoder_start_token_id=2, eos_token_id=2, pad_token_id=1, max_length=MAX_LENGTH,
        num_beams=5, early_stopping=True)
    model.save_pretrained(out)
    return stats


def build_all(root: str) -> dict[str, dict]:
    """Build every model under ROOT (replacing an earlier build there) and return {name: info};
    ROOT/models.json, written last, marks the build complete."""
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        os.remove(marker)
    work = os.path.join(root, "work")
    for name in (*NAMES, "work"):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    os.makedirs(work)
    t0 = time.time()
    pairs, cs_test, en_test = toy_pairs()
    cs_lines, en_lines = [c for c, _ in pairs], [e for _, e in pairs]
    spm = {"cs": train_sentencepiece(cs_lines, os.path.join(work, "cs"), SPM_VOCAB),
           "en": train_sentencepiece(en_lines, os.path.join(work, "en"), SPM_VOCAB),
           "joint": train_sentencepiece(cs_lines + en_lines, os.path.join(work, "joint"), M2M_SPM_VOCAB)}
    seconds = {"sentencepiece": round(time.time() - t0, 1)}
    tests = {"cs-en": {"sentences": cs_test, "references": en_test},
             "en-cs": {"sentences": en_test, "references": cs_test}}
    stats = {}
    with _quiet_torch(THREADS):
        stats["marian_cs_en"] = build_marian(os.path.join(root, "marian_cs_en"), "cs", "en", spm["cs"], spm["en"],
                                             pairs)
        stats["marian_en_cs"] = build_marian(os.path.join(root, "marian_en_cs"), "en", "cs", spm["en"], spm["cs"],
                                             [(e, c) for c, e in pairs])
        stats["m2m100"] = build_m2m100(os.path.join(root, "m2m100"), spm["joint"], pairs)
    shutil.rmtree(work)

    def info(name, family, directions, tokenizer_class, lang_codes):
        path = os.path.join(root, name)
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        src, tgt = directions[0]
        return {"path": path, "family": family, "src_lang": src, "tgt_lang": tgt,
                "directions": [list(d) for d in directions], "lang_codes": lang_codes,
                "tokenizer_class": tokenizer_class,
                "tokenizer_files": sorted(f for f in os.listdir(path) if f not in MODEL_FILES),
                "weights": ["model.safetensors"],
                "test_sentences": tests[f"{src}-{tgt}"]["sentences"],
                "test_references": tests[f"{src}-{tgt}"]["references"],
                "tests": {f"{s}-{t}": tests[f"{s}-{t}"] for s, t in directions},
                "vocab_size": config["vocab_size"], "d_model": DIM, "ffn_dim": FFN, "heads": HEADS,
                "layers": list(LAYERS), "steps": STEPS[family], "train": stats[name]}

    built = {"marian_cs_en": info("marian_cs_en", "marian", [("cs", "en")], "MarianTokenizer", {}),
             "marian_en_cs": info("marian_en_cs", "marian", [("en", "cs")], "MarianTokenizer", {}),
             "m2m100": info("m2m100", "m2m100", [("cs", "en"), ("en", "cs")], "M2M100Tokenizer", dict(M2M_CODES))}
    seconds.update({name: s["seconds"] for name, s in stats.items()})
    seconds["total"] = round(time.time() - t0, 1)
    tmp = marker + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format_version": FORMAT_VERSION, "seconds": seconds, "models": _relative(built, root)},
                  f, ensure_ascii=False, indent=1)
    os.replace(tmp, marker)
    return built


def _relative(obj, root: str):
    """OBJ with every path under ROOT written as $ROOT/... (a build stays usable when moved)."""
    if isinstance(obj, dict):
        return {k: _relative(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_relative(v, root) for v in obj]
    if isinstance(obj, str) and (obj == root or obj.startswith(root + os.sep)):
        return "$ROOT" + obj[len(root):]
    return obj


def _absolute(obj, root: str):
    if isinstance(obj, dict):
        return {k: _absolute(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_absolute(v, root) for v in obj]
    if isinstance(obj, str) and (obj == "$ROOT" or obj.startswith("$ROOT" + os.sep)):
        return root + obj[len("$ROOT"):]
    return obj


def load_built(root: str) -> dict[str, dict] | None:
    """The info dicts of a complete build of this version under ROOT, else None."""
    root = os.path.abspath(root)
    try:
        with open(os.path.join(root, MARKER), encoding="utf-8") as f:
            built = json.load(f)
    except (OSError, ValueError):
        return None
    if built.get("format_version") != FORMAT_VERSION or set(built.get("models", {})) != set(NAMES):
        return None
    info = _absolute(built["models"], root)
    if not all(os.path.isfile(os.path.join(i["path"], f)) for i in info.values()
               for f in (*MODEL_FILES, *i["tokenizer_files"])):
        return None
    return info


def build_seconds(root: str) -> dict | None:
    """The stage timings a complete build under ROOT recorded."""
    try:
        with open(os.path.join(root, MARKER), encoding="utf-8") as f:
            return json.load(f).get("seconds")
    except (OSError, ValueError):
        return None


def layouts_for_tests(tmp_path_factory) -> dict[str, dict]:
    """{name: info} for a test session: the build in $PARAGEN_TEST_TRANSFORMERS_MODELS when it is
    complete, else a fresh build there (when set) or in a pytest temporary directory."""
    reuse = os.environ.get(ENV_VAR)
    if reuse:
        return load_built(reuse) or build_all(reuse)
    return build_all(str(tmp_path_factory.mktemp("transformers-models")))


# ----------------------------------------------------------------------------------- reference

@functools.lru_cache(maxsize=8)
def load(path: str):
    """(model, tokenizer) of the transformers directory PATH, offline, in eval mode (cached: the
    tokenizer's src_lang/tgt_lang are set by each helper before use)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(path, local_files_only=True)
    model.eval()
    return model, AutoTokenizer.from_pretrained(path, local_files_only=True)


def _langs(info, src_lang, tgt_lang) -> tuple[str, str]:
    src_lang, tgt_lang = src_lang or info["src_lang"], tgt_lang or info["tgt_lang"]
    if [src_lang, tgt_lang] not in info["directions"]:
        raise ValueError(f"{info['path']} does not translate {src_lang} -> {tgt_lang}")
    return src_lang, tgt_lang


def _tokenizer(info, src_lang, tgt_lang):
    model, tok = load(info["path"])
    if info["family"] != "marian":
        tok.src_lang, tok.tgt_lang = src_lang, tgt_lang
    return model, tok


def generate(info, sentences, beam, src_lang=None, tgt_lang=None, **kwargs):
    """transformers' generate on SENTENCES, batched: num_beams=BEAM, return_dict_in_generate,
    forced_bos_token_id = the target code for M2M-100; KWARGS go to generate."""
    import torch

    src_lang, tgt_lang = _langs(info, src_lang, tgt_lang)
    model, tok = _tokenizer(info, src_lang, tgt_lang)
    enc = tok(list(sentences), return_tensors="pt", padding=True)
    if info["lang_codes"]:
        kwargs["forced_bos_token_id"] = tok.convert_tokens_to_ids(info["lang_codes"][tgt_lang])
    with torch.no_grad():
        return model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], num_beams=beam,
                              max_length=MAX_LENGTH, return_dict_in_generate=True, **kwargs)


def reference_translate(info, sentences, beam, src_lang=None, tgt_lang=None) -> list[str]:
    """The best beam hypotheses of transformers' generate (num_beams=BEAM) for SENTENCES,
    decoded with skip_special_tokens=True."""
    src_lang, tgt_lang = _langs(info, src_lang, tgt_lang)
    _, tok = load(info["path"])
    out = generate(info, sentences, beam, src_lang, tgt_lang)
    return tok.batch_decode(out.sequences, skip_special_tokens=True)


def reference_log_probs(info, pairs, src_lang=None, tgt_lang=None, mask_pad=None) -> list[list[float]]:
    """Teacher-forced natural log-probabilities from the transformers model of each target token
    of PAIRS [(source, target)]: the target as the family's tokenizer makes it
    (``text_target``), "</s>" included, the language code (M2M-100) excluded. MASK_PAD (default:
    True for Marian) leaves <pad> out of the softmax, as CTranslate2 does for Marian (whose
    converted vocabulary has no <pad>); CTranslate2 keeps <pad> in M2M-100's softmax."""
    import torch

    src_lang, tgt_lang = _langs(info, src_lang, tgt_lang)
    model, tok = _tokenizer(info, src_lang, tgt_lang)
    if mask_pad is None:
        mask_pad = info["family"] == "marian"
    out = []
    for source, target in pairs:
        enc = tok([source], text_target=[target], return_tensors="pt")
        labels = enc["labels"]
        with torch.no_grad():
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).logits
        if mask_pad:
            logits[..., model.config.pad_token_id] = float("-inf")
        lp = torch.log_softmax(logits[0].double(), dim=-1).gather(-1, labels[0][:, None])[:, 0].tolist()
        out.append(lp[1:] if info["lang_codes"] else lp)
    return out


# --------------------------------------------------------------------- CTranslate2 conventions

def ct2_source_tokens(info, sentences, src_lang=None) -> list[list[str]]:
    """What a CTranslate2 Translator of a converted model takes as source: the tokenizer's tokens
    with its special tokens (Marian: pieces + "</s>"; M2M-100: [src code, pieces..., "</s>"])."""
    src_lang = src_lang or info["src_lang"]
    tgt_lang = next((t for s, t in info["directions"] if s == src_lang), None)
    _, tok = _tokenizer(info, *_langs(info, src_lang, tgt_lang))
    return [tok.convert_ids_to_tokens(tok(s)["input_ids"]) for s in sentences]


def ct2_target_prefix(info, n: int, tgt_lang=None) -> list[list[str]] | None:
    """translate_batch's target_prefix for N sentences: [[tgt code]] * N for M2M-100, None for Marian."""
    tgt_lang = tgt_lang or info["tgt_lang"]
    return [[info["lang_codes"][tgt_lang]] for _ in range(n)] if info["lang_codes"] else None


def ct2_target_tokens(info, targets, src_lang=None, tgt_lang=None) -> list[list[str]]:
    """score_batch's targets: the target tokens without "</s>" (score_batch appends it), the
    target code first for M2M-100 (score with offset=ct2_score_offset(info))."""
    src_lang, tgt_lang = _langs(info, src_lang, tgt_lang)
    _, tok = _tokenizer(info, src_lang, tgt_lang)
    out = []
    for target in targets:
        tokens = tok.convert_ids_to_tokens(tok(text_target=target)["input_ids"])
        assert tokens[-1] == tok.eos_token, tokens
        out.append(tokens[:-1])
    return out


def ct2_score_offset(info) -> int:
    return 1 if info["lang_codes"] else 0


def ct2_detokenize(info, tokens: list[str]) -> str:
    """Text of a CTranslate2 hypothesis: the language code (M2M-100: hypothesis[0]) dropped."""
    _, tok = load(info["path"])
    if info["lang_codes"]:
        assert tokens and tokens[0] in info["lang_codes"].values(), tokens
        tokens = tokens[1:]
    return tok.decode(tok.convert_tokens_to_ids(tokens), skip_special_tokens=True)


if __name__ == "__main__":       # python tests/transformers_fixtures.py DIR: build (for development)
    sys.path.insert(0, ROOT)
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(ENV_VAR) or "transformers-models"
    start = time.time()
    built = build_all(out)
    print(json.dumps(build_seconds(out), indent=1))
    print(f"built {', '.join(built)} in {time.time() - start:.1f}s under {os.path.abspath(out)}")
