"""Tiny real fairseq translation models (cs -> en) in the layouts fairseq users bring.

Every model is trained here, offline, with fairseq's own command-line tools
(``python -m models.nmt.model_files.fairseq_compat preprocess|train``) on 1,400 pairs of the synthetic bitext
of tests/toydata.py (its canonical English renderings only, see :func:`toy_data`): a 1-2 layer
d64 transformer, 450 updates, 15-30 s each. :func:`build_all` builds them all under one ROOT, two
fairseq processes side by side, in about 80-120 s on 2 CPU cores. On the 12 held-out test
sentences every model gets BLEU 100 with fairseq's hub (beam 5), and its best hypothesis beats
the second by a clear margin (no near-ties)::

    ROOT/hub_single/      model.pt  dict.cs.txt  dict.en.txt  bpecodes
        A hub archive as fairseq's transformer.wmt16.en-de: Moses-tokenized text (sacremoses,
        aggressive dash splits, escaping: fairseq's ``moses`` tokenizer), joint subword-nmt codes
        (``bpecodes``, first line ``#version: 0.2``), separate dictionaries, one checkpoint in the
        OLD format: ``state["args"]`` an argparse.Namespace and no ``"cfg"`` key at all. Arch
        ``transformer``: post-norm, sinusoidal positions, ``share_decoder_input_output_embed``.
    ROOT/hub_ensemble/    model1.pt  model2.pt  dict.cs.txt  dict.en.txt  bpecodes
        As transformer.wmt19.de-en: Moses, ``bpecodes`` in fastBPE format (``a b count`` lines:
        the subword-nmt merges of hub_single with their frequencies, in merge order; the text is
        segmented with fastBPE itself), a joined dictionary (dict.cs.txt == dict.en.txt),
        ``--share-all-embeddings``, learned positional embeddings, two members trained on the same
        data-bin with seeds 1 and 2, in the NEW checkpoint format (``args`` None, ``cfg`` a dict
        whose ``cfg["model"]`` is a Namespace).
    ROOT/train_spm/       checkpoints/checkpoint_best.pt  checkpoints/checkpoint_last.pt
                          data-bin/{dict.cs.txt, dict.en.txt, train.cs-en.*, valid.cs-en.*}
                          sentencepiece.bpe.model
        A fairseq-train run as a user has it (optimizer state kept): text encoded with a joint
        sentencepiece model (fairseq's ``sentencepiece`` bpe: pieces joined by spaces), no Moses,
        separate dictionaries, pre-norm (``--encoder-normalize-before --decoder-normalize-before``),
        2 encoder layers and 1 decoder layer, no embedding sharing.
    ROOT/big_shrunk/      model.pt  dict.cs.txt  dict.en.txt  bpecodes
        Arch ``transformer_wmt_en_de_big`` with every dimension overridden on the command line
        (d64, ffn 128, 2 heads, 1+1 layers): the dimensions are in the config fields, not in the
        arch name. Moses + subword-nmt as hub_single (same data-bin), new checkpoint format.
    ROOT/old_args/        model.pt  dict.cs.txt  dict.en.txt  bpecodes
        big_shrunk's checkpoint converted to the OLD format (``args`` the Namespace with
        ``task='translation'``, ``source_lang``, ``target_lang``, ``arch``; ``cfg`` None), as the
        wmt16/wmt19 releases: arch transformer_wmt_en_de_big in an old-format checkpoint.
    ROOT/old_keys/        model.pt  dict.cs.txt  dict.en.txt  bpecodes
        (Beyond the five asked for.) old_args with the tensor names of older fairseq releases,
        which fairseq's upgrade_state_dict_named still renames on load (:func:`legacy_state_dict`):
        attention
        ``in_proj_weight``/``in_proj_bias`` (q, k, v stacked) instead of q_proj/k_proj/v_proj,
        ``layers.N.layer_norms.{0,1[,2]}`` instead of self_attn/encoder_attn/final_layer_norm,
        ``decoder.embed_out`` instead of ``decoder.output_projection.weight``, and the sinusoidal
        ``embed_positions._float_tensor`` buffers. A loader that skips fairseq's upgrade fails here.
    ROOT/hub_ensemble_en_cs/  model1.pt  model2.pt  dict.cs.txt  dict.en.txt  bpecodes
        The other direction (en -> cs) of hub_ensemble, from the same data-bin (fairseq reads a
        pair's binarized text either way round), two seeds, shared embeddings, sinusoidal positions:
        with hub_ensemble, a generation job can run with imported ensembles both ways. Its
        test_sentences are the English references, its test_references the Czech sources.
    ROOT/work/            tokenized text, the shared data-bins, training logs and save dirs
    ROOT/layouts.json     written last: the info dicts (paths relative to ROOT), the mark of a
                          complete build (:func:`load_built`)

Each layout comes with an info dict: ``source`` (what a user gives an import command: the
archive directory, or the checkpoint file for train_spm), ``checkpoints`` (member file names, in
``source`` or beside the checkpoint), ``data`` (the data-bin for train_spm, else None),
``tokenizer`` ("moses" | "none"), ``bpe`` ("subword_nmt" | "fastbpe" | "sentencepiece"),
``bpe_codes`` (codes file or sentencepiece model), ``src_lang``, ``tgt_lang``, ``hub_kwargs`` (what
makes ``fairseq.models.transformer.TransformerModel.from_pretrained(**hub_kwargs)`` load it as
fairseq would), ``test_sentences`` (12 raw Czech sentences whose meaning never occurs in the
training or validation data), ``test_references`` (the canonical English of each, what the
models say), ``test_acceptable`` (every English rendering of each, canonical first: for
multi-reference BLEU), ``synonym_variation`` (False), and the facts the tests check: ``format``
("args": old Namespace checkpoint | "cfg": new), ``arch``, ``layers`` ([encoder, decoder]),
``dim``, ``ffn_dim``, ``heads``, ``seeds``, ``normalize_before``, ``learned_pos``,
``joined_dictionary``, ``legacy_keys``.

Using the layouts in tests (a session fixture is not defined here; tests/test_fairseq_fixtures.py
has one, ``fairseq_layouts``, to copy or import)::

    @pytest.fixture(scope="session")
    def fairseq_layouts(tmp_path_factory):
        from tests.fairseq_fixtures import layouts_for_tests
        return layouts_for_tests(tmp_path_factory)      # {layout name: info dict}

``layouts_for_tests`` honours PARAGEN_TEST_FAIRSEQ_LAYOUTS: a directory that holds a complete build
is reused as it is; a directory without one is built into (so the next session reuses it).
Before loading a checkpoint with fairseq in a test process, call
``models.nmt.model_files.checkpoint.allow_fairseq_checkpoints()`` (torch >= 2.6 refuses argparse.Namespace).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
SRC, TGT = "cs", "en"
LAYOUTS = ("hub_single", "hub_ensemble", "train_spm", "big_shrunk", "old_args", "old_keys", "hub_ensemble_en_cs")
MARKER = "layouts.json"
FORMAT_VERSION = 3
ENV_VAR = "PARAGEN_TEST_FAIRSEQ_LAYOUTS"

TRAIN_PAIRS, VALID_PAIRS, TEST_SENTENCES = 1400, 60, 12
BPE_MERGES = 100           # leaves the rarer words split: "@@ " is really there to undo
SPM_VOCAB = 200
DIM, FFN, HEADS = 64, 128, 2
MAX_UPDATE = 450
THREADS = 1                # per fairseq process; two run side by side on 2 cores

# fairseq-train settings shared by every model (cf. TINY in tests/conftest.py): a 1-layer d64
# transformer learns the toy bitext in a few hundred updates; dropout 0.1 (not 0) is what gets
# every held-out (unseen) combination right, with 450 updates
TRAIN_ARGS = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "3e-3",
              "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "30",
              "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
              "--dropout", "0.1", "--attention-dropout", "0.0", "--activation-dropout", "0.0",
              "--max-tokens", "1024", "--max-update", str(MAX_UPDATE),
              "--no-epoch-checkpoints", "--log-interval", "50", "--log-format", "simple",
              "--num-workers", "0", "--cpu",
              # fairseq 0.12 drops a last batch smaller than this multiple (default 8)
              "--required-batch-size-multiple", "1"]


def _dims(encoder_layers: int = 1, decoder_layers: int = 1) -> list[str]:
    return ["--encoder-layers", str(encoder_layers), "--decoder-layers", str(decoder_layers),
            "--encoder-embed-dim", str(DIM), "--decoder-embed-dim", str(DIM),
            "--encoder-ffn-embed-dim", str(FFN), "--decoder-ffn-embed-dim", str(FFN),
            "--encoder-attention-heads", str(HEADS), "--decoder-attention-heads", str(HEADS)]


# ----------------------------------------------------------------------------------------- data

def toy_data(seed: int = 0, variation: bool = False) -> tuple[list, list, list[str], list[str], list[list[str]]]:
    """(train pairs, valid pairs, test sources, test references, acceptable translations) drawn
    from tests/toydata.py.

    The TEST_SENTENCES test sources are (subject, verb, place) combinations that occur in neither
    the training nor the validation pairs, so a model translates them by composing what it
    learned. Without VARIATION only the pairs of toy_bitext whose English is the canonical
    rendering (first synonyms, subject first) are kept: a model then has one right answer, its
    beam's best hypothesis wins by a clear margin (no near-ties between synonyms that a
    numerically different reimplementation could flip), and the reference of a test source is
    that canonical rendering. The acceptable translations of each test source are every English
    rendering toy_bitext could give it (synonyms, both word orders), canonical first."""
    from tests.toydata import PLACES, SUBJECTS, VERBS, toy_bitext

    def czech(s, v, p):
        cs = f"{SUBJECTS[s][0]} {VERBS[v][0]} {PLACES[p][0]} ."
        return cs[0].upper() + cs[1:]

    def renderings(s, v, p):
        first, second = [], []
        for subj in SUBJECTS[s][1]:
            for verb in VERBS[v][1]:
                for place in PLACES[p][1]:
                    first.append(f"{subj[0].upper()}{subj[1:]} {verb} {place} .")
                    second.append(f"{place[0].upper()}{place[1:]} , {subj} {verb} .")
        return first + second

    combos = [(s, v, p) for s in range(len(SUBJECTS)) for v in range(len(VERBS)) for p in range(len(PLACES))]
    canonical = {czech(*c): renderings(*c)[0] for c in combos}
    test = random.Random(1000 + seed).sample(combos, TEST_SENTENCES)
    sources = [czech(*c) for c in test]
    held = set(sources)
    want = TRAIN_PAIRS + VALID_PAIRS
    pool, n = [], want
    while len(pool) < want:
        n *= 2
        pool = [(cs, en) for cs, en in toy_bitext(n, seed)
                if cs not in held and (variation or en == canonical[cs])][:want]
    acceptable = [renderings(*c) for c in test]
    return pool[:TRAIN_PAIRS], pool[TRAIN_PAIRS:], sources, [a[0] for a in acceptable], acceptable


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """As fairseq's ``moses`` tokenizer encodes (fairseq/data/encoders/moses_tokenizer.py)."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang)
    return [tok.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True) for line in lines]


def learn_subword_nmt(lines: list[str], codes_path: str, merges: int = BPE_MERGES) -> list[tuple[str, str, int]]:
    """Learn joint subword-nmt codes on LINES into CODES_PATH (``#version: 0.2`` header); returns
    the merges in order with their frequencies (from learn_bpe's verbose log)."""
    from subword_nmt.learn_bpe import learn_bpe

    log = io.StringIO()
    with contextlib.redirect_stderr(log), open(codes_path, "w", encoding="utf-8") as out:
        learn_bpe(io.StringIO("".join(line + "\n" for line in lines)), out, merges, verbose=True)
    found = re.findall(r"pair \d+: (\S+) (\S+) -> \S+ \(frequency (\d+)\)\n", log.getvalue())
    with open(codes_path, encoding="utf-8") as f:
        written = [tuple(line.split()) for line in f.read().splitlines()[1:]]
    merged = [(a, b, int(n)) for a, b, n in found]
    assert [(a, b) for a, b, _ in merged] == written, "learn_bpe's log and codes file disagree"
    return merged


def subword_nmt_apply(lines: list[str], codes_path: str) -> list[str]:
    """Segment as fairseq's ``subword_nmt`` bpe does (fairseq/data/encoders/subword_nmt_bpe.py)."""
    from subword_nmt import apply_bpe

    with open(codes_path, encoding="utf-8") as codes:
        bpe = apply_bpe.BPE(codes, -1, "@@", None, None)
    return [bpe.process_line(line) for line in lines]


def write_fastbpe_codes(merges: list[tuple[str, str, int]], path: str) -> None:
    """fastBPE's codes format: ``a b count`` per line, in merge order, no header."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{a} {b} {n}\n" for a, b, n in merges)


def fastbpe_apply(lines: list[str], codes_path: str) -> list[str]:
    """Segment as fairseq's ``fastbpe`` bpe does (fairseq/data/encoders/fastbpe.py)."""
    import fastBPE

    bpe = fastBPE.fastBPE(codes_path)
    return [bpe.apply([line])[0] for line in lines]


def train_sentencepiece(lines: list[str], prefix: str, vocab_size: int = SPM_VOCAB) -> str:
    """A joint BPE sentencepiece model at PREFIX.model (deterministic: one thread)."""
    import sentencepiece as spm

    text = prefix + ".train.txt"
    with open(text, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
                                   num_threads=1)
    os.remove(text)
    return prefix + ".model"


def sentencepiece_apply(lines: list[str], model: str) -> list[str]:
    """As fairseq's ``sentencepiece`` bpe encodes: pieces joined by spaces."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model)
    return [" ".join(sp.encode(line, out_type=str)) for line in lines]


def _write_split(prefix: str, src_lines: list[str], tgt_lines: list[str]) -> None:
    assert len(src_lines) == len(tgt_lines)
    for lang, lines in ((SRC, src_lines), (TGT, tgt_lines)):
        with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)


# ----------------------------------------------------------------------------------- fairseq CLI

def run_fairseq(command: str, args: list[str], log_path: str) -> float:
    """``python -m models.nmt.model_files.fairseq_compat COMMAND ARGS`` from the repository root, one thread;
    returns its wall seconds, raises with the log's tail when it fails."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "models.nmt.model_files.fairseq_compat", command, *args],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log_path, errors="replace") as log:
            tail = log.read()[-3000:]
        raise RuntimeError(f"fairseq-{command} failed (exit {proc.returncode}), {log_path}:\n{tail}")
    return time.time() - start


def preprocess(text_prefix: str, dest: str, log_path: str, joined: bool = False) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    args = ["--source-lang", SRC, "--target-lang", TGT, "--trainpref", text_prefix + "/train",
            "--validpref", text_prefix + "/valid", "--destdir", dest, "--workers", "1"]
    return run_fairseq("preprocess", args + (["--joined-dictionary"] if joined else []), log_path)


def train(data_bin: str, save_dir: str, log_path: str, model_args: list[str], seed: int = 1,
          keep_optimizer: bool = False, reverse: bool = False) -> float:
    """fairseq-train SRC->TGT, or TGT->SRC with REVERSE (fairseq reads the same data-bin)."""
    shutil.rmtree(save_dir, ignore_errors=True)
    src, tgt = (TGT, SRC) if reverse else (SRC, TGT)
    args = [data_bin, "--source-lang", src, "--target-lang", tgt, *model_args, *TRAIN_ARGS,
            "--save-dir", save_dir, "--seed", str(seed)]
    if not keep_optimizer:
        args += ["--no-save-optimizer-state", "--no-last-checkpoints"]
    return run_fairseq("train", args, log_path)


# ---------------------------------------------------------------------------------- checkpoints

def _load(path: str) -> dict:
    import torch

    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    return torch.load(path, map_location="cpu", weights_only=True)


def export_checkpoint(src: str, dst: str) -> None:
    """A release copy of a fairseq-train checkpoint (new cfg format), without optimizer state."""
    import torch

    state = _load(src)
    state.pop("last_optimizer_state", None)
    torch.save(state, dst)


def to_old_format(src: str, dst: str, drop_cfg_key: bool = False, legacy_keys: bool = False) -> argparse.Namespace:
    """Rewrite a new-format checkpoint SRC as the old format at DST: ``state["args"]`` the model's
    Namespace (``cfg["model"]``, without the dataclass ``_name``, plus the fields old checkpoints
    have: task, source_lang, target_lang, arch, data) and ``cfg`` None, or no ``cfg`` key at all
    with DROP_CFG_KEY; with LEGACY_KEYS the tensors renamed by :func:`legacy_state_dict`. The
    optimizer state is dropped, as in fairseq's releases."""
    import torch

    state = _load(src)
    cfg = state["cfg"]
    assert state.get("args") is None and isinstance(cfg["model"], argparse.Namespace), "not a new-format checkpoint"
    args = argparse.Namespace(**vars(cfg["model"]))
    task = cfg.get("task") or {}
    get = task.get if isinstance(task, dict) else lambda k, d=None: getattr(task, k, d)
    vars(args).pop("_name", None)
    args.task = "translation"
    args.source_lang = get("source_lang", None) or SRC
    args.target_lang = get("target_lang", None) or TGT
    args.data = get("data", None) or getattr(args, "data", "")
    args.arch = cfg["model"].arch
    state["args"] = args
    if legacy_keys:
        state["model"] = legacy_state_dict(state["model"], args)
    if drop_cfg_key:
        state.pop("cfg")
    else:
        state["cfg"] = None
    state.pop("last_optimizer_state", None)
    torch.save(state, dst)
    return args


def legacy_state_dict(model: dict, args: argparse.Namespace) -> dict:
    """MODEL (a transformer's state dict) with the tensor names of older fairseq releases, which
    fairseq's upgrade_state_dict_named methods turn back into the current ones on load:
    q_proj/k_proj/v_proj -> in_proj_weight/in_proj_bias (stacked q, k, v; MultiheadAttention),
    encoder layers' self_attn_layer_norm/final_layer_norm -> layer_norms.0/1 (TransformerEncoderLayer),
    decoder layers' self_attn/encoder_attn/final_layer_norm -> layer_norms.0/1/2 (TransformerDecoder),
    decoder.output_projection.weight -> decoder.embed_out, or nothing when tied to the input
    embeddings, and an ``embed_positions._float_tensor`` per sinusoidal position embedding."""
    import torch

    out = dict(model)
    for key in [k for k in out if k.endswith(".q_proj.weight")]:
        prefix = key[:-len("q_proj.weight")]
        for kind in ("weight", "bias"):
            parts = [out.pop(f"{prefix}{p}_proj.{kind}") for p in "qkv"]
            out[f"{prefix}in_proj_{kind}"] = torch.cat(parts, dim=0)
    norms = {"encoder": ("self_attn_layer_norm", "final_layer_norm"),
             "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")}
    for key in list(out):
        m = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(\w+)\.(weight|bias)", key)
        if m and m.group(3) in norms[m.group(1)]:
            index = norms[m.group(1)].index(m.group(3))
            out[f"{m.group(1)}.layers.{m.group(2)}.layer_norms.{index}.{m.group(4)}"] = out.pop(key)
    projection = out.pop("decoder.output_projection.weight")
    if not (args.share_decoder_input_output_embed or args.share_all_embeddings):
        out["decoder.embed_out"] = projection
    for side in ("encoder", "decoder"):
        if not getattr(args, f"{side}_learned_pos") and not getattr(args, "no_token_positional_embeddings", False):
            out[f"{side}.embed_positions._float_tensor"] = torch.FloatTensor(1)
    return out


# ---------------------------------------------------------------------------------------- build

def _archive(dst: str, data_bin: str, codes: str, members: dict[str, tuple]) -> None:
    """An archive directory DST: dictionaries from DATA_BIN, ``bpecodes`` from CODES and
    MEMBERS {file name: (converter, source checkpoint)}."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for lang in (SRC, TGT):
        shutil.copyfile(os.path.join(data_bin, f"dict.{lang}.txt"), os.path.join(dst, f"dict.{lang}.txt"))
    shutil.copyfile(codes, os.path.join(dst, "bpecodes"))
    for name, (convert, ckpt) in members.items():
        convert(ckpt, os.path.join(dst, name))


def build_all(root: str, jobs: int = 2, variation: bool = False) -> dict[str, dict]:
    """Build every layout under ROOT (replacing an earlier build there) and return
    {layout name: info dict}; ROOT/layouts.json, written last, marks the build complete.
    JOBS fairseq processes run side by side (one thread each). VARIATION: train on toy_bitext's
    synonymous English renderings too (see toy_data; near-ties between them in the beam)."""
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        os.remove(marker)
    for name in (*LAYOUTS, "work"):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    t0 = time.time()
    work = os.path.join(root, "work")
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    train_pairs, valid_pairs, test_sources, test_refs, test_ok = toy_data(variation=variation)
    splits = {"train": train_pairs, "valid": valid_pairs}
    raw = {split: ([s for s, _ in pairs], [t for _, t in pairs]) for split, pairs in splits.items()}

    # text: Moses -> subword-nmt (hub_single, big_shrunk, old_args) and fastBPE (hub_ensemble);
    # sentencepiece on the raw text (train_spm)
    moses = {split: (moses_tokenize(s, SRC), moses_tokenize(t, TGT)) for split, (s, t) in raw.items()}
    codes = os.path.join(work, "bpecodes.subword_nmt")
    merges = learn_subword_nmt(moses["train"][0] + moses["train"][1], codes)
    fast_codes = os.path.join(work, "bpecodes.fastbpe")
    write_fastbpe_codes(merges, fast_codes)
    spm_dir = os.path.join(root, "train_spm")
    os.makedirs(spm_dir)
    spm_model = train_sentencepiece(raw["train"][0] + raw["train"][1], os.path.join(work, "spm"))
    shutil.copyfile(spm_model, os.path.join(spm_dir, "sentencepiece.bpe.model"))
    spm_model = os.path.join(spm_dir, "sentencepiece.bpe.model")
    texts = {"bpe": lambda lines: subword_nmt_apply(lines, codes),
             "fastbpe": lambda lines: fastbpe_apply(lines, fast_codes),
             "spm": lambda lines: sentencepiece_apply(lines, spm_model)}
    for kind, encode in texts.items():
        os.makedirs(os.path.join(work, kind))
        for split in splits:
            src, tgt = raw[split] if kind == "spm" else moses[split]
            _write_split(os.path.join(work, kind, split), encode(src), encode(tgt))
    bins = {"bpe": os.path.join(work, "data-bin.bpe"), "fastbpe": os.path.join(work, "data-bin.fastbpe"),
            "spm": os.path.join(spm_dir, "data-bin")}
    seconds = {"text": round(time.time() - t0, 1)}

    with ThreadPoolExecutor(jobs) as pool:
        done = {kind: pool.submit(preprocess, os.path.join(work, kind), bins[kind],
                                  os.path.join(logs, f"preprocess.{kind}.log"), joined=kind == "fastbpe")
                for kind in bins}
        for kind, future in done.items():
            seconds[f"preprocess.{kind}"] = round(future.result(), 1)
    shutil.rmtree(os.path.join(work, "spm"))       # the data-bin holds the text now
    save = {name: os.path.join(work, f"checkpoints.{name}") for name in
            ("single", "ensemble1", "ensemble2", "big", "reverse1", "reverse2")}
    runs = {   # slowest first, so that the two lanes finish together
        "train_spm": (bins["spm"], os.path.join(spm_dir, "checkpoints"),
                      ["--arch", "transformer", *_dims(2, 1), "--encoder-normalize-before",
                       "--decoder-normalize-before"], 1, True),
        "ensemble1": (bins["fastbpe"], save["ensemble1"],
                      ["--arch", "transformer", *_dims(), "--share-all-embeddings",
                       "--encoder-learned-pos", "--decoder-learned-pos"], 1, False),
        "ensemble2": (bins["fastbpe"], save["ensemble2"],
                      ["--arch", "transformer", *_dims(), "--share-all-embeddings",
                       "--encoder-learned-pos", "--decoder-learned-pos"], 2, False),
        "single": (bins["bpe"], save["single"],
                   ["--arch", "transformer", *_dims(), "--share-decoder-input-output-embed"], 1, False),
        "big": (bins["bpe"], save["big"], ["--arch", "transformer_wmt_en_de_big", *_dims()], 1, False),
        # the other direction (en -> cs) of hub_ensemble, for a generation job with ensembles both ways
        "reverse1": (bins["fastbpe"], save["reverse1"],
                     ["--arch", "transformer", *_dims(), "--share-all-embeddings"], 1, False, True),
        "reverse2": (bins["fastbpe"], save["reverse2"],
                     ["--arch", "transformer", *_dims(), "--share-all-embeddings"], 2, False, True),
    }
    t1 = time.time()
    with ThreadPoolExecutor(jobs) as pool:
        done = {name: pool.submit(train, data, out, os.path.join(logs, f"train.{name}.log"), args, seed, keep,
                                  *rest)
                for name, (data, out, args, seed, keep, *rest) in runs.items()}
        for name, future in done.items():
            seconds[f"train.{name}"] = round(future.result(), 1)
    seconds["train (wall)"] = round(time.time() - t1, 1)

    best = {name: os.path.join(path, "checkpoint_best.pt") for name, path in save.items()}
    _archive(os.path.join(root, "hub_single"), bins["bpe"], codes,
             {"model.pt": (lambda s, d: to_old_format(s, d, drop_cfg_key=True), best["single"])})
    _archive(os.path.join(root, "hub_ensemble"), bins["fastbpe"], fast_codes,
             {"model1.pt": (export_checkpoint, best["ensemble1"]),
              "model2.pt": (export_checkpoint, best["ensemble2"])})
    _archive(os.path.join(root, "hub_ensemble_en_cs"), bins["fastbpe"], fast_codes,
             {"model1.pt": (export_checkpoint, best["reverse1"]),
              "model2.pt": (export_checkpoint, best["reverse2"])})
    _archive(os.path.join(root, "big_shrunk"), bins["bpe"], codes, {"model.pt": (export_checkpoint, best["big"])})
    _archive(os.path.join(root, "old_args"), bins["bpe"], codes, {"model.pt": (to_old_format, best["big"])})
    _archive(os.path.join(root, "old_keys"), bins["bpe"], codes,
             {"model.pt": (lambda s, d: to_old_format(s, d, legacy_keys=True), best["big"])})
    for path in save.values():          # the archives hold the models now
        shutil.rmtree(path)

    test = {"test_sentences": test_sources, "test_references": test_refs, "test_acceptable": test_ok,
            "synonym_variation": variation}

    def archive_info(name, checkpoints, bpe, fmt, arch, layers=(1, 1), seeds=(1,), **extra):
        path = os.path.join(root, name)
        kwargs = {"model_name_or_path": path, "checkpoint_file": ":".join(checkpoints),
                  "data_name_or_path": ".", "tokenizer": "moses", "bpe": bpe,
                  "bpe_codes": os.path.join(path, "bpecodes")}
        return {"source": path, "checkpoints": list(checkpoints), "data": None, "tokenizer": "moses", "bpe": bpe,
                "bpe_codes": os.path.join(path, "bpecodes"), "src_lang": SRC, "tgt_lang": TGT,
                "hub_kwargs": kwargs, "format": fmt, "arch": arch, "layers": list(layers), "dim": DIM,
                "ffn_dim": FFN, "heads": HEADS, "seeds": list(seeds), "legacy_keys": False, **extra, **test}

    spm_ckpt = os.path.join(spm_dir, "checkpoints", "checkpoint_best.pt")
    info = {
        "hub_single": archive_info("hub_single", ["model.pt"], "subword_nmt", "args", "transformer",
                                   normalize_before=False, learned_pos=False, joined_dictionary=False),
        "hub_ensemble": archive_info("hub_ensemble", ["model1.pt", "model2.pt"], "fastbpe", "cfg",
                                     "transformer", seeds=(1, 2), normalize_before=False, learned_pos=True,
                                     joined_dictionary=True),
        "train_spm": {
            "source": spm_ckpt, "checkpoints": ["checkpoint_best.pt"], "data": bins["spm"], "tokenizer": "none",
            "bpe": "sentencepiece", "bpe_codes": spm_model, "src_lang": SRC, "tgt_lang": TGT,
            "hub_kwargs": {"model_name_or_path": os.path.dirname(spm_ckpt), "checkpoint_file": "checkpoint_best.pt",
                           "data_name_or_path": bins["spm"], "bpe": "sentencepiece",
                           "sentencepiece_model": spm_model},
            "format": "cfg", "arch": "transformer", "layers": [2, 1], "dim": DIM, "ffn_dim": FFN, "heads": HEADS,
            "seeds": [1], "normalize_before": True, "learned_pos": False, "joined_dictionary": False,
            "legacy_keys": False, **test},
        "hub_ensemble_en_cs": {**archive_info("hub_ensemble_en_cs", ["model1.pt", "model2.pt"], "fastbpe", "cfg",
                                              "transformer", seeds=(1, 2), normalize_before=False, learned_pos=False,
                                              joined_dictionary=True),
                               "src_lang": TGT, "tgt_lang": SRC, "test_sentences": test_refs,
                               "test_references": test_sources, "test_acceptable": [[x] for x in test_sources]},
        "big_shrunk": archive_info("big_shrunk", ["model.pt"], "subword_nmt", "cfg", "transformer_wmt_en_de_big",
                                   normalize_before=False, learned_pos=False, joined_dictionary=False),
        "old_args": archive_info("old_args", ["model.pt"], "subword_nmt", "args", "transformer_wmt_en_de_big",
                                 normalize_before=False, learned_pos=False, joined_dictionary=False),
        "old_keys": archive_info("old_keys", ["model.pt"], "subword_nmt", "args", "transformer_wmt_en_de_big",
                                 normalize_before=False, learned_pos=False, joined_dictionary=False,
                                 legacy_keys=True),
    }
    t1 = time.time()
    info = without_near_ties(info)
    seconds["near ties"] = round(time.time() - t1, 1)
    seconds["total"] = round(time.time() - t0, 1)
    tmp = marker + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format_version": FORMAT_VERSION, "seconds": seconds, "layouts": _relative(info, root)},
                  f, ensure_ascii=False, indent=1)
    os.replace(tmp, marker)
    return info


MIN_MARGIN = 0.05                  # nats between a test sentence's best and second-best beam hypotheses
MIN_TEST_SENTENCES = 8
_PER_SENTENCE = ("test_sentences", "test_references", "test_acceptable")


def beam_margins(info: dict) -> list[float]:
    """Score of the best minus that of the second-best of a beam of 5, per test sentence, as fairseq's
    hub interface decodes them."""
    from fairseq.models.transformer import TransformerModel

    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    model = TransformerModel.from_pretrained(**info["hub_kwargs"]).eval()
    outputs = model.generate([model.encode(s) for s in info["test_sentences"]], beam=5)
    return [float(hypos[0]["score"]) - float(hypos[1]["score"]) for hypos in outputs]


def without_near_ties(info: dict) -> dict:
    """INFO without the test sentences that some layout's model decodes with a near-tie between its
    two best hypotheses: a numerically different reimplementation could flip those, and whether
    training on a given machine lands on one depends on its floating-point kernels. Every
    layout's lists are indexed alike (the en-cs layout's sentences are the others' references)."""
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    n = len(next(iter(info.values()))["test_sentences"])
    keep = set(range(n))
    for layout in info.values():
        keep -= {i for i, margin in enumerate(beam_margins(layout)) if margin < MIN_MARGIN}
    if len(keep) < MIN_TEST_SENTENCES:
        raise RuntimeError(f"only {len(keep)} of {n} test sentences are decoded without a near-tie by every layout")
    return {name: {**layout, **{key: [layout[key][i] for i in sorted(keep)] for key in _PER_SENTENCE}}
            for name, layout in info.items()}


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
    if built.get("format_version") != FORMAT_VERSION or set(built.get("layouts", {})) != set(LAYOUTS):
        return None
    info = _absolute(built["layouts"], root)
    if not all(os.path.exists(i["source"]) for i in info.values()):
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
    """{layout: info} for a test session: the build in $PARAGEN_TEST_FAIRSEQ_LAYOUTS when it is
    complete, else a fresh build there (when set) or in a pytest temporary directory."""
    reuse = os.environ.get(ENV_VAR)
    if reuse:
        return load_built(reuse) or build_all(reuse)
    return build_all(str(tmp_path_factory.mktemp("fairseq-layouts")))


if __name__ == "__main__":       # python tests/fairseq_fixtures.py DIR: build (for development)
    sys.path.insert(0, ROOT)
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(ENV_VAR) or "fairseq-layouts"
    start = time.time()
    built = build_all(out)
    print(json.dumps(build_seconds(out), indent=1))
    print(f"built {', '.join(built)} in {time.time() - start:.1f}s under {os.path.abspath(out)}")
