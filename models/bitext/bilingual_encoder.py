"""Bilingual sentence embeddings learnt by translating and autoencoding (Kim, Rosendahl,
Rossenbach, Rosendahl, Khadivi & Ney 2019, "Learning Bilingual Sentence Embeddings via
Autoencoding and Computing Similarities with a Multilayer Perceptron").

    enc = load_bilingual_encoder("runs/bilingual-cs-en")
    cs = enc.encode(["Muž sedí v parku ."], "cs")          # numpy (1, dim)
    en = enc.encode(["A man sits in the park ."], "en")    # same space

Model: one bidirectional LSTM encoder per language and ONE target-language LSTM decoder, shared.
A sentence's embedding is the max-pool over time of its encoder's output states; the decoder's
initial state is that vector through a linear layer and tanh, and the decoder has no attention, so
the pooled vector is the only path from encoder to decoder. Training alternates mini-batches of
translation (source encoder -> target sentence) and autoencoding (target encoder -> the same
target sentence): both encoders must produce vectors the one decoder can read, which is meant to
put the two languages in one space. Extra target-side monolingual text only feeds autoencoding
batches.

Not in the paper: translation batches also encode their target sentences and add an in-batch
alignment loss (:func:`alignment_loss`, weight ``align_weight``, 0 to leave it out). The paper's
objective alone aligns the two encoders only with far more data and training than a CPU run
gives (on Multi30k cs-en, after two epochs: 90% alignment-recovery error by CSLS, against 7%
with the alignment loss; docs/benchmarks.md).

One sentencepiece model covers both languages (trained on both sides of the bitext together);
the token embedding table is shared by the two encoders and the decoder, so pieces both languages
use (names, numbers) start from one vector.

Directory layout: ``config.json`` (:class:`BilingualConfig`, written last: it marks a whole
model), ``weights.pt`` (a plain state dict, loaded weights-only through
models.safety.load_tensor_file), ``spm.model``; ``training.json`` (the training report) is
not needed to load.
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from models.safety import UnsafeModelError, load_tensor_file, save_torch_file
from common.atomic import replacing, write_json

FORMAT_VERSION = 1
FILES = ("config.json", "weights.pt", "spm.model")
# Module token ids: three reserved ids, then sentencepiece's pieces shifted by N_SPECIAL (so the
# reserved ids do not depend on how the sentencepiece model was trained).
PAD, BOS, EOS = 0, 1, 2
N_SPECIAL = 3
SIDES = ("src", "tgt")
SPM_MAX_SENTENCES = 2_000_000      # sentencepiece trains on a random sample of a larger bitext
ALIGN_WEIGHT = 1.0                 # weight of the in-batch alignment loss (0: the paper's objective alone)
ALIGN_TEMPERATURE = 0.05           # its softmax temperature (cosines / temperature)
FINAL_LR_SHARE = 0.1               # the learning rate decays (cosine) to this share of --lr at the end

# Upper bounds: config.json decides tensor sizes before any weight is read, so a hostile file
# must not be able to ask for terabytes.
_LIMITS = {"vocab_size": (1, 1_000_000), "emb_dim": (1, 8192), "hidden": (1, 8192), "layers": (1, 16),
           "max_pieces": (1, 100_000)}


@dataclass(frozen=True)
class BilingualConfig:
    src_lang: str
    tgt_lang: str
    vocab_size: int = 8000        # sentencepiece pieces (after training: the model's real size)
    emb_dim: int = 256
    hidden: int = 512             # per direction; embeddings have 2 * hidden dimensions
    layers: int = 1
    max_pieces: int = 100         # pieces kept per sentence
    dropout: float = 0.1
    format_version: int = FORMAT_VERSION

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """ValueError unless every field has its type and range (bool is not an int here)."""
        from common.names import check_lang_code

        for name in ("src_lang", "tgt_lang"):
            check_lang_code(getattr(self, name), name)
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang must differ, both are {self.src_lang!r}")
        for name, (lo, hi) in _LIMITS.items():
            value = getattr(self, name)
            if type(value) is not int or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")
        if type(self.dropout) not in (int, float) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a number in [0, 1), not {self.dropout!r}")
        if type(self.format_version) is not int or self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version!r}: this code reads {FORMAT_VERSION}")

    @property
    def dim(self) -> int:
        return 2 * self.hidden

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data, source: str = "config") -> "BilingualConfig":
        """A config from untrusted JSON: unknown or missing keys and wrong types are refused
        with UnsafeModelError (nothing is coerced)."""
        if not isinstance(data, dict):
            raise UnsafeModelError(f"{source}: holds a {type(data).__name__}, not an object")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(map(str, set(data) - fields))
        if unknown:
            raise UnsafeModelError(f"{source}: unknown key(s) {unknown}; expected only {sorted(fields)}")
        missing = sorted(fields - set(data))
        if missing:
            raise UnsafeModelError(f"{source}: missing key(s) {missing}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise UnsafeModelError(f"{source}: {exc}") from None


class BilingualEncoderModule(nn.Module):
    """The two encoders, the shared decoder and the token embeddings all three read."""

    def __init__(self, cfg: BilingualConfig):
        super().__init__()
        self.cfg = cfg
        n_tokens = cfg.vocab_size + N_SPECIAL
        self.embedding = nn.Embedding(n_tokens, cfg.emb_dim, padding_idx=PAD)
        self.encoders = nn.ModuleDict({side: nn.LSTM(cfg.emb_dim, cfg.hidden, cfg.layers, batch_first=True,
                                                     bidirectional=True) for side in SIDES})
        self.bridge = nn.Linear(2 * cfg.hidden, 2 * cfg.layers * cfg.hidden)    # -> decoder (h0, c0)
        self.decoder = nn.LSTM(cfg.emb_dim, cfg.hidden, cfg.layers, batch_first=True)
        self.output = nn.Linear(cfg.hidden, n_tokens)
        self.dropout = nn.Dropout(cfg.dropout)

    @property
    def dim(self) -> int:
        return 2 * self.cfg.hidden

    def encode_states(self, ids: torch.Tensor, lengths: torch.Tensor, side: str
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(states (B, T, 2*hidden), mask (B, T), True on real tokens) of the SIDE encoder.
        Sequences are packed, so the states of a sentence do not depend on the padding."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        if lengths.numel() and int(lengths.min()) < 1:
            raise ValueError("every sentence needs at least one token")
        x = self.dropout(self.embedding(ids))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.encoders[side](packed)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.size(1))
        mask = torch.arange(ids.size(1), device=ids.device)[None, :] < lengths.to(ids.device)[:, None]
        return states, mask

    def embed(self, ids: torch.Tensor, lengths: torch.Tensor, side: str) -> torch.Tensor:
        """(B, 2*hidden) max-pool over the real positions: padding is -inf, never the max (its
        zero states would win wherever all real states are negative)."""
        states, mask = self.encode_states(ids, lengths, side)
        return states.masked_fill(~mask[:, :, None], float("-inf")).amax(dim=1)

    def loss(self, ids: torch.Tensor, lengths: torch.Tensor, side: str, tgt_ids: torch.Tensor,
             tgt_lengths: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy per target token (EOS included) of decoding TGT_IDS from the
        embedding of IDS, with teacher forcing."""
        return self.decoding_loss(self.embed(ids, lengths, side), tgt_ids, tgt_lengths)

    def decoding_loss(self, embedding: torch.Tensor, tgt_ids: torch.Tensor, tgt_lengths: torch.Tensor
                      ) -> torch.Tensor:
        """:meth:`loss` from sentence embeddings (B, 2*hidden) already computed."""
        b = embedding.size(0)
        h = self.cfg.hidden
        init = torch.tanh(self.bridge(embedding))                                  # (B, 2*layers*hidden)
        init = init.view(b, 2, self.cfg.layers, h).permute(1, 2, 0, 3).contiguous()  # (2, layers, B, h)
        tgt_lengths = tgt_lengths.to(tgt_ids.device)
        column = torch.empty((b, 1), dtype=tgt_ids.dtype, device=tgt_ids.device)
        dec_in = torch.cat([column.fill_(BOS), tgt_ids], dim=1)                     # BOS y1 .. yL
        targets = torch.cat([tgt_ids, column.fill_(PAD)], dim=1)
        targets[torch.arange(b, device=tgt_ids.device), tgt_lengths] = EOS          # y1 .. yL EOS
        out, _ = self.decoder(self.dropout(self.embedding(dec_in)), (init[0], init[1]))
        real = targets != PAD
        logits = self.output(self.dropout(out[real]))        # only real positions reach the softmax
        return F.cross_entropy(logits, targets[real])


def pad_batch(id_lists: Sequence[Sequence[int]], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, T) padded with PAD, lengths (B,)) for lists of module token ids."""
    lengths = torch.tensor([len(r) for r in id_lists], dtype=torch.long)
    ids = torch.full((len(id_lists), int(lengths.max()) if id_lists else 0), PAD, dtype=torch.long)
    for i, r in enumerate(id_lists):
        ids[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return ids.to(device), lengths.to(device)


class BilingualEncoder:
    """A trained module with its sentencepiece model: sentences in, vectors out."""

    def __init__(self, cfg: BilingualConfig, sp, module: BilingualEncoderModule | None = None,
                 device: str | None = None):
        if sp.get_piece_size() != cfg.vocab_size:
            raise ValueError(f"sentencepiece model has {sp.get_piece_size()} pieces, config says {cfg.vocab_size}")
        self.cfg, self.sp = cfg, sp
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.module = (module or BilingualEncoderModule(cfg)).to(self.device)

    @property
    def dim(self) -> int:
        return self.cfg.dim

    @property
    def langs(self) -> tuple[str, str]:
        return self.cfg.src_lang, self.cfg.tgt_lang

    def side(self, lang: str) -> str:
        """'src' or 'tgt' for LANG; ValueError for a language this model was not trained on."""
        if lang == self.cfg.src_lang:
            return "src"
        if lang == self.cfg.tgt_lang:
            return "tgt"
        raise ValueError(f"this bilingual encoder knows {self.cfg.src_lang!r} and {self.cfg.tgt_lang!r}, "
                         f"not {lang!r}")

    def token_ids(self, sentences: Sequence[str]) -> list[list[int]]:
        """Module token ids of each sentence, cut to max_pieces; an empty sentence is [EOS] (an
        encoder needs one token)."""
        texts = [s if isinstance(s, str) else "" for s in sentences]
        pieces = self.sp.encode(texts) if texts else []
        return [[p + N_SPECIAL for p in ps[:self.cfg.max_pieces]] or [EOS] for ps in pieces]

    @torch.no_grad()
    def encode(self, sentences: Sequence[str], lang: str, batch_size: int = 256) -> np.ndarray:
        """float32 array (len(sentences), dim) in input order. Sorted by length inside, so a
        batch pads little (the embeddings do not depend on it)."""
        side = self.side(lang)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        ids = self.token_ids(sentences)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        was_training = self.module.training
        self.module.eval()
        try:
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                batch = pad_batch([ids[i] for i in idx], self.device)
                out[idx] = self.module.embed(*batch, side).float().cpu().numpy()
        finally:
            self.module.train(was_training)
        return out

    def save(self, path: str) -> None:
        """Write the model directory. An old config.json goes first and the new one comes last,
        so a reader never takes a mix of two models for a whole one."""
        os.makedirs(path, exist_ok=True)
        config_path = os.path.join(path, "config.json")
        if os.path.exists(config_path):
            os.remove(config_path)
        save_torch_file({k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                        os.path.join(path, "weights.pt"))
        with replacing(os.path.join(path, "spm.model")) as tmp:
            with open(tmp, "wb") as f:
                f.write(self.sp.serialized_model_proto())
        write_json(config_path, self.cfg.to_dict())


def load_bilingual_encoder(path: str, device: str | None = None) -> BilingualEncoder:
    """The model in directory PATH (or a bucket URL, copied to the local cache first). Nothing in
    it runs code: the config is checked field by field, weights load weights-only and must match
    the config's shapes exactly."""
    import sentencepiece as spm

    from models.safety import open_model_dir

    path, data = open_model_dir(path, FILES, "bilingual encoder")
    cfg = BilingualConfig.from_dict(data, os.path.join(path, "config.json"))
    weights = load_tensor_file(os.path.join(path, "weights.pt"))
    try:
        sp = spm.SentencePieceProcessor(model_file=os.path.join(path, "spm.model"))
    except (RuntimeError, OSError) as exc:
        raise UnsafeModelError(f"{path}/spm.model: not a sentencepiece model ({exc})") from None
    try:
        enc = BilingualEncoder(cfg, sp, device=device)
        enc.module.load_state_dict(weights, strict=True)
    except (ValueError, RuntimeError) as exc:
        raise UnsafeModelError(f"{path}: weights or spm.model do not match config.json "
                               f"({str(exc).splitlines()[0]})") from None
    enc.module.eval()
    return enc


# ---------------------------------------------------------------------------------- training

def check_training_options(epochs: int, batch_size: int, lr: float) -> None:
    if type(epochs) is not int or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if type(batch_size) is not int or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not (isinstance(lr, (int, float)) and 0 < lr < 10):
        raise ValueError(f"lr must be a number in (0, 10), got {lr!r}")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_sentencepiece(texts: Sequence[str], vocab_size: int, rng: random.Random, workdir: str):
    """A joint unigram sentencepiece model on TEXTS (a random sample of at most
    SPM_MAX_SENTENCES), loaded. The vocabulary shrinks if the text cannot fill it."""
    import sentencepiece as spm

    from common.text import train_spm

    if len(texts) > SPM_MAX_SENTENCES:
        texts = rng.sample(list(texts), SPM_MAX_SENTENCES)
    path = train_spm(list(texts), os.path.join(workdir, "spm"), vocab_size)
    return spm.SentencePieceProcessor(model_file=path)


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random, pool: int = 50) -> list[list[int]]:
    """Indices in shuffled batches of similar lengths: shuffled, sorted by length within pools of
    POOL batches (less padding, so fewer wasted LSTM steps), then the batches shuffled."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size * pool):
        part = sorted(order[start:start + batch_size * pool], key=lambda i: lengths[i])
        batches += [part[j:j + batch_size] for j in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def _clean(text) -> str:
    return " ".join(text.split()) if isinstance(text, str) else ""


def train_bilingual(pairs: Iterable[tuple[str, str]], out_dir: str, cfg: BilingualConfig,
                    monolingual: Iterable[str] | None = None, epochs: int = 5, batch_size: int = 64,
                    lr: float = 1e-3, device: str | None = None, seed: int = 1, log=print,
                    progress: bool = True, align_weight: float = ALIGN_WEIGHT,
                    dev_pairs: Sequence[tuple[str, str]] | None = None) -> dict:
    """Train on PAIRS ((source, target) sentences) and MONOLINGUAL target text, write the model
    directory OUT_DIR and return the report (also OUT_DIR/training.json): per-epoch mean
    translation and autoencoding losses, in "translation_loss" / "autoencoding_loss" and "epochs".

    An epoch is one pass over the bitext in translation batches, each followed by one
    autoencoding batch (1:1) drawn from the bitext's target side plus MONOLINGUAL. Adam at LR,
    decayed along a cosine to FINAL_LR_SHARE of it by the last step. DEVICE: None
    for CUDA when present, else CPU. ALIGN_WEIGHT > 0 adds :func:`alignment_loss` to the
    translation batches (not in the paper; see docs/bitext-models.md). DEV_PAIRS: held-out pairs
    whose alignment-recovery error (cosine and CSLS, mean of both directions) is measured after
    every epoch, in the report's "dev_error"."""
    check_training_options(epochs, batch_size, lr)
    if not (isinstance(align_weight, (int, float)) and 0 <= align_weight <= 100):
        raise ValueError(f"align_weight must be a number in [0, 100], got {align_weight!r}")
    set_seed(seed)
    rng = random.Random(seed)
    t0 = time.time()
    pairs = [(_clean(s), _clean(t)) for s, t in pairs]
    pairs = [(s, t) for s, t in pairs if s and t]
    mono = [t for t in (_clean(x) for x in (monolingual or ())) if t]
    if not pairs:
        raise ValueError("no training pairs (after dropping pairs with an empty side)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="bilingual-spm-") as tmp:
        sp = train_sentencepiece([s for s, _ in pairs] + [t for _, t in pairs], cfg.vocab_size, rng, tmp)
    if sp.get_piece_size() != cfg.vocab_size:
        log(f"sentencepiece vocabulary: {sp.get_piece_size()} pieces (asked for {cfg.vocab_size})")
        cfg = dataclasses.replace(cfg, vocab_size=sp.get_piece_size())
    enc = BilingualEncoder(cfg, sp, device=device)
    src_ids = enc.token_ids([s for s, _ in pairs])
    tgt_ids = enc.token_ids([t for _, t in pairs])
    ae_ids = tgt_ids + enc.token_ids(mono)
    n_params = sum(p.numel() for p in enc.module.parameters())
    log(f"{len(pairs)} pairs, {len(mono)} monolingual {cfg.tgt_lang} sentences; {cfg.vocab_size} pieces; "
        f"{n_params / 1e6:.1f}M parameters; embeddings of {cfg.dim} dims; on {enc.device}")
    optimizer = torch.optim.Adam(enc.module.parameters(), lr=lr)
    steps = 2 * len(length_batches([len(x) for x in src_ids], batch_size, random.Random(0))) * epochs
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=lr * FINAL_LR_SHARE)
    report = {"config": cfg.to_dict(), "pairs": len(pairs), "monolingual": len(mono),
              "training": {"epochs": epochs, "batch_size": batch_size, "lr": lr, "seed": seed,
                           "align_weight": align_weight, "device": str(enc.device)},
              "epochs": [], "translation_loss": [], "autoencoding_loss": []}
    src_len = [len(x) for x in src_ids]
    ae_len = [len(x) for x in ae_ids]
    for epoch in range(1, epochs + 1):
        entry = _train_epoch(enc, (optimizer, schedule), src_ids, tgt_ids, src_len, ae_ids, ae_len, batch_size, rng,
                             f"epoch {epoch}/{epochs}", progress, align_weight)
        entry = {"epoch": epoch, **entry}
        if dev_pairs:
            entry["dev_error"] = dev_alignment_error(enc, dev_pairs)
        report["epochs"].append(entry)
        report["translation_loss"].append(entry["translation_loss"])
        report["autoencoding_loss"].append(entry["autoencoding_loss"])
        log(f"epoch {epoch}: translation loss {entry['translation_loss']:.4f}, autoencoding loss "
            f"{entry['autoencoding_loss']:.4f}"
            + (f", alignment loss {entry['alignment_loss']:.4f}" if "alignment_loss" in entry else "")
            + "".join(f", dev error by {m} {100 * e:.1f}%" for m, e in entry.get("dev_error", {}).items())
            + f" ({entry['seconds']:.0f}s)")
    enc.module.eval()
    report["seconds"] = round(time.time() - t0, 1)
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "training.json"), report)
    enc.save(out_dir)
    return report


def dev_alignment_error(enc: BilingualEncoder, dev_pairs: Sequence[tuple[str, str]],
                        methods: Sequence[str] = ("cosine", "csls")) -> dict[str, float]:
    """Mean alignment-recovery error (both directions) of DEV_PAIRS by each of METHODS."""
    from models.bitext.alignment import recover_alignment

    src, tgt = [s for s, _ in dev_pairs], [t for _, t in dev_pairs]
    res = recover_alignment(src, tgt, encoder=enc, methods=methods, baselines=())
    return {m: round(res["methods"][m]["mean"], 4) for m in methods}


def alignment_loss(src_emb: torch.Tensor, tgt_emb: torch.Tensor, temperature: float = ALIGN_TEMPERATURE
                   ) -> torch.Tensor:
    """In-batch contrastive loss of paired embeddings (row i of each side is one pair): softmax
    cross-entropy of each sentence picking its own translation by cosine among the batch's other
    side, both directions, averaged."""
    a, b = F.normalize(src_emb, dim=1), F.normalize(tgt_emb, dim=1)
    logits = a @ b.T / temperature
    labels = torch.arange(a.size(0), device=a.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _train_epoch(enc: BilingualEncoder, optimizer: tuple, src_ids, tgt_ids, src_len, ae_ids, ae_len, batch_size: int,
                 rng: random.Random, desc: str, progress: bool, align_weight: float = 0.0) -> dict:
    """One epoch of alternating translation / autoencoding steps; mean losses and seconds.
    OPTIMIZER: (optimizer, learning-rate schedule), the schedule stepped after every step. With
    ALIGN_WEIGHT > 0 a translation step also encodes its target sentences and adds that weight
    times :func:`alignment_loss` of the pair's two embeddings."""
    from tqdm import tqdm

    module, device = enc.module, enc.device
    module.train()
    start = time.time()
    trans_batches = length_batches(src_len, batch_size, rng)
    ae_batches = length_batches(ae_len, batch_size, rng)[:len(trans_batches)]
    losses = {"translation": [], "autoencoding": [], "alignment": []}
    bar = tqdm(total=len(src_ids), desc=desc, unit="pair", disable=not progress, mininterval=2.0, file=sys.stderr)

    optimizer, schedule = optimizer

    def step(loss):
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        schedule.step()

    for tb, ab in zip(trans_batches, ae_batches):
        src = pad_batch([src_ids[i] for i in tb], device)
        tgt = pad_batch([tgt_ids[i] for i in tb], device)
        src_emb = module.embed(*src, "src")
        loss = module.decoding_loss(src_emb, *tgt)
        losses["translation"].append(loss.item())
        if align_weight > 0 and len(tb) > 1:
            align = alignment_loss(src_emb, module.embed(*tgt, "tgt"))
            losses["alignment"].append(align.item())
            loss = loss + align_weight * align
        step(loss)
        ae = pad_batch([ae_ids[i] for i in ab], device)
        loss = module.loss(*ae, "tgt", *ae)
        losses["autoencoding"].append(loss.item())
        step(loss)
        bar.update(len(tb))
        bar.set_postfix(tr=f"{np.mean(losses['translation'][-50:]):.3f}",
                        ae=f"{np.mean(losses['autoencoding'][-50:]):.3f}",
                        **({"al": f"{np.mean(losses['alignment'][-50:]):.3f}"} if losses["alignment"] else {}),
                        refresh=False)          # drawn at the bar's mininterval, not at every batch
    bar.close()
    out = {"translation_loss": float(np.mean(losses["translation"])),
           "autoencoding_loss": float(np.mean(losses["autoencoding"])),
           "batches": len(trans_batches), "seconds": round(time.time() - start, 2)}
    if losses["alignment"]:
        out["alignment_loss"] = float(np.mean(losses["alignment"]))
    return out
