"""The generation job's command line: its own options (Beam style, --snake_case) and the parser.
What they mean for a run is decided in check.py; Beam's options pass through (options.py)."""
from __future__ import annotations

import argparse

from beam_pipelines.options import cluster_options_epilog
from common.shards import DEFAULT_MAX_LINE_CHARS
from models.nmt.devices import PRECISIONS, STEP_MODES
from paracorpus.compaction import DEFAULT_FILE_MB, DEFAULT_FILE_ROWS
from paracorpus.config import PRESETS
from paracorpus.units import DEFAULT_UNIT_PAIRS

DEFAULT_PROCESSES_PER_GPU = 4
DESCRIPTION = "The generation job: bitext shards -> paraphrase Parquet partitions, rejects and a manifest."

# the settings a preset gives and an option may change: (name, type, help)
TUNABLES = (("mode", str, "decoding: 'sample' (ParaBank 2: top-k sampling under negative constraints) or "
                          "'beam' (ParaNMT: beam search)"),
            ("num_sets", int, "S: negative-constraint sets per pair (sample mode)"),
            ("num_samples", int, "N: top-k samples per constraint set (sample mode)"),
            ("topk", int, "k of top-k sampling"),
            ("max_banned_words", int, "words per constraint set, 1 to this"),
            ("beam", int, "beam size (beam mode)"),
            ("nbest", int, "hypotheses kept per source (beam mode)"),
            ("clusters", int, "k free Levenshtein clusters (plus the reference cluster)"),
            ("keep", int, "n paraphrases kept per pair"),
            ("score_threshold", float, "drop candidates whose combined score is above this (<0: off)"),
            ("dual_xent_threshold", float, "drop pairs whose dual cross-entropy is above this before "
                                           "decoding (<0: off; needs --backward_model)"),
            ("seed", int, "random seed (same seed, same output)"),
            ("batch_pairs", int, "pairs per decoding call"),
            ("num_output_shards", int, "output partitions per language pair"),
            ("max_pieces", int, "reject a pair with more sentencepiece pieces on a side (also capped by the "
                                "models' positions)"))


def _preset_values(name: str) -> str:
    def show(v):
        return "off" if v is None else v
    return ", ".join(f"{preset} {show(getattr(cfg, name))}" for preset, cfg in PRESETS.items())


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    """The job's own options, Beam style (--snake_case). Not a PipelineOptions subclass: those are
    re-parsed from the Beam arguments by every view_as(), where our required options are absent."""
    g = parser.add_argument_group("input and output")
    g.add_argument("--input", action="extend", nargs="+", required=True, metavar="PATH",
                   help="input shards: .tsv (src<TAB>tgt) or .parquet files, globs, directories, or Moses prefixes "
                        "(PREFIX.<src_lang> + PREFIX.<tgt_lang>); text may be .gz/.bz2/.xz/.zst; several after one "
                        "--input (what a shell glob gives), repeated, or comma-separated (required)")
    g.add_argument("--output", required=True, metavar="DIR",
                   help="output directory: paraphrases/, rejects/ (Parquet in numbered partition folders, not "
                        "Hive-style), _manifest.json (required)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run committed in --output when this one commits, even one with the same "
                        "inputs, models and settings; until then it stays readable (default: refuse a committed "
                        "run with another plan, and do nothing when it has this plan)")
    g.add_argument("--resume", action="store_true",
                   help="continue the unfinished run in --output with the same inputs, models and settings, "
                        "skipping its finished work units: what the same command does anyway (kept for scripts "
                        "that pass it)")
    g.add_argument("--previous", metavar="RUN", default=None,
                   help="a committed run to build on: input shards whose content, models and settings are "
                        "unchanged keep its output (not decoded again), new pairs are deduplicated against its "
                        "pairs, shards it had and this run has not drop out (default: none, decode everything)")
    g.add_argument("--allow_empty", action="store_true",
                   help="publish a run that has no paraphrase row (every record rejected, or none read); by default "
                        "such a run is not published and the job exits with status 3 (the previous run stays)")
    g.add_argument("--dry_run", action="store_true",
                   help="print the plan (input shards, records, bytes, work units, the files the run would publish, "
                        "an estimate of the decoding time) and exit without writing anything")
    g.add_argument("--rate", type=float, default=None, metavar="PAIRS_PER_S",
                   help="with --dry_run: decoding speed of one worker to estimate from (default: measured on a "
                        "sample of the input with the models, on this machine)")
    g.add_argument("--run_id", default=None,
                   help="the new run's id (letters, digits, '.', '_', '-'); a refresh names a run after its "
                        "directory this way (default: UTC time plus a random part)")
    g.add_argument("--continue_only", action="store_true",
                   help="with --run_id: continue that run when it is this command's (the same plan: a stopped "
                        "attempt, or published with its clean-up left), else write nothing and say so; how "
                        "paragen-refresh continues a stopped refresh, decided under the output's claim")
    g.add_argument("--unit_pairs", type=int, default=DEFAULT_UNIT_PAIRS,
                   help=f"records per work unit: the piece of decoding work one worker does, retries and resumes "
                        f"(default {DEFAULT_UNIT_PAIRS})")
    g.add_argument("--file_rows", type=int, default=DEFAULT_FILE_ROWS,
                   help=f"published files hold up to this many rows: each input shard's unit files in an output "
                        f"partition are rewritten into files this size (default {DEFAULT_FILE_ROWS:,})")
    g.add_argument("--file_mb", type=float, default=DEFAULT_FILE_MB,
                   help=f"... or this many MB, whichever comes first (default {DEFAULT_FILE_MB})")
    g.add_argument("--src_column", default=None,
                   help="Parquet input: the foreign side's column (default: the --src_lang code)")
    g.add_argument("--tgt_column", default=None,
                   help="Parquet input: the English side's column (default: the --tgt_lang code)")
    g = parser.add_argument_group("models and languages")
    g.add_argument("--forward_model", required=True, metavar="DIR",
                   help="model directory (paragen-train-nmt) translating src_lang -> tgt_lang: the generator "
                        "(required)")
    g.add_argument("--backward_model", default=None, metavar="DIR",
                   help="model directory translating tgt_lang -> src_lang, for dual scoring and the dual "
                        "cross-entropy filter (default: none, forward scores only)")
    g.add_argument("--src_lang", default="cs",
                   help="language code of the foreign side, the input's first column (default cs); the forward "
                        "model must translate src_lang->tgt_lang, the backward one tgt_lang->src_lang")
    g.add_argument("--tgt_lang", default="en",
                   help="language code of the side paraphrased, the input's second column (default en)")
    g.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="where to decode (default: cuda when a GPU is visible to the worker, else cpu)")
    g.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="model weights' precision (default auto: tf32 on an NVIDIA GPU of compute capability 8.0 "
                        "or later, else fp32; fp32 decoded a 6-layer d512 model faster than bf16 or fp16 on an H100, "
                        "docs/benchmarks.md); tf32 (a GPU only): fp32 weights, matrix products on tensor cores; "
                        "bf16 or fp16 may pay off for larger models; bf16 on a CPU needs AVX512-BF16 or AMX; all "
                        "but fp32 give slightly different scores")
    g.add_argument("--processes_per_gpu", type=int, default=DEFAULT_PROCESSES_PER_GPU,
                   help=f"decoding processes sharing each GPU, so that one process's host work (tokenization, "
                        f"clustering, writing) overlaps another's decoding; on a GPU machine the DirectRunner starts "
                        f"GPUs x this many worker processes unless --direct_running_mode is given (default "
                        f"{DEFAULT_PROCESSES_PER_GPU})")
    g.add_argument("--decode_step", default="auto", choices=STEP_MODES,
                   help="how sampling runs a decoder step (fairseq models): tree = the eager loop over the prefix "
                        "tree (auto: the fastest measured, CPU and GPU); fixed = fixed shapes, eager; compiled = "
                        "fixed shapes fused by torch.compile (compiled once per worker process, tens of seconds); "
                        "graphs = compiled and replayed as CUDA graphs (a GPU only). The same samples in each "
                        "(docs/internals.md)")
    g.add_argument("--mps", default="auto", choices=["auto", "on", "off"],
                   help="run a DirectRunner job's GPU worker processes under a CUDA MPS control daemon of its own, "
                        "so that their kernels overlap instead of taking turns (auto: with a GPU, more than one "
                        "process per GPU and nvidia-cuda-mps-control installed; the GPU's compute mode is left "
                        "as it is); off: never; on: refuse to run without it")
    g.add_argument("--torch_threads", type=int, default=0,
                   help="CPU threads of each worker process's model (default 0 = auto: the cores divided by "
                        "the DirectRunner's worker processes; elsewhere torch's default, which follows "
                        "OMP_NUM_THREADS)")
    g = parser.add_argument_group("generation settings (defaults come from --preset)")
    g.add_argument("--preset", default="parabank2-cpu", choices=sorted(PRESETS),
                   help="paper settings to start from (default parabank2-cpu; parabank2 = Hu et al. 2019, "
                        "paranmt = Wieting & Gimpel 2018, wieting2017 = Wieting et al. 2017)")
    for name, typ, doc in TUNABLES:
        kwargs = {"choices": ["sample", "beam"]} if name == "mode" else {}
        g.add_argument(f"--{name}", type=typ, default=None, **kwargs,
                       help=f"{doc} (default from the preset: {_preset_values(name)})")
    g = parser.add_argument_group("cleaning (ParaBank 2)")
    g.add_argument("--max_line_chars", type=int, default=DEFAULT_MAX_LINE_CHARS,
                   help=f"records longer than this are rejected unparsed (default {DEFAULT_MAX_LINE_CHARS})")
    g.add_argument("--max_tokens", type=int, default=100, help="max whitespace tokens per side (default 100)")
    g.add_argument("--max_length_ratio", type=float, default=3.0,
                   help="max token-length ratio of the two sides (default 3.0)")
    g.add_argument("--encodings", default="",
                   help="per-language charset rule, e.g. 'en=latin-1,cs=iso8859-2'; 'xx=' disables it "
                        "(default: latin-1 for en/de/fr/es, latin-2 for cs/pl/sk/hu, none otherwise)")


def add_bitext_filter_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("bitext filter (before back-translation: drop pairs that are not translations)")
    g.add_argument("--bitext_encoder", metavar="DIR", default=None,
                   help="bilingual sentence encoder (paragen-train-bilingual) for the source-reference cosine "
                        "(default: none, no similarity filter)")
    g.add_argument("--bitext_mlp", metavar="DIR", default=None,
                   help="its MLP pair classifier (paragen-train-pair-classifier): the score becomes the "
                        "probability that the pair is parallel (default: cosine)")
    g.add_argument("--bitext_min_similarity", type=float, default=None,
                   help="reject a pair whose cosine (or MLP probability) is below this, reason "
                        "bitext_similarity (required with --bitext_encoder)")
    g.add_argument("--divergence_model", metavar="DIR", default=None,
                   help="semantic-divergence detector (paragen-train-divergence); a pair it finds divergent is "
                        "rejected, reason divergent (default: none)")
    g.add_argument("--min_equivalence", type=float, default=None,
                   help="reject below this P(equivalent) (default: the threshold the detector was tuned with)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paragen-generate", description=DESCRIPTION, allow_abbrev=False,
        epilog="Beam's options pass through: --runner DirectRunner|DaskRunner|FlinkRunner|DataflowRunner, "
               "--direct_running_mode multi_processing, --direct_num_workers N, --dask_client_address HOST:PORT, "
               "--setup_file ./setup.py, ... Any other option is an error. Example: paragen-generate --input "
               "examples/cs-en.example.tsv --output runs/example-out --forward_model runs/example-models/cs-en "
               "--backward_model runs/example-models/en-cs (models from scripts/quickstart.sh)." + " " + cluster_options_epilog())
    add_generate_args(parser)
    add_bitext_filter_args(parser)
    return parser
