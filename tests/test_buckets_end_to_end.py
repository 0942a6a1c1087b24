"""The three jobs reading and writing only bucket URLs, models in the bucket too, on real S3
(moto) and GCS (fake-gcs-server) servers on loopback, and on a real HDFS (a MiniDFSCluster) through
webhdfs:// URLs: generation on the DirectRunner and on a real
dask.distributed cluster, then the filter job, then embedding training. The rows equal those of
the same runs on a local disk."""
import os

import numpy as np
import pytest

from beam_pipelines import filter as filter_job
from beam_pipelines.generate import run as generate
from embeddings.train import run as train_embeddings
from common import storage
from paracorpus.commit import committed_files
from tests.hdfs_cluster import hdfs_store  # noqa: F401  (fixture)
from tests.object_stores import gcs_store, s3_store  # noqa: F401  (fixtures)
from tests.claims import claim_record

_FLOATS = ("forward_nll", "backward_nll", "combined_score")
FILTER_CONFIG = "filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.6}}\n  - name: lm_perplexity\n"


def _gen_args(inp, out, fwd, bwd, *extra):
    return ["--input", inp, "--output", out, "--forward_model", fwd, "--backward_model", bwd,
            "--num_sets", "2", "--num_samples", "4", "--score_threshold", "20", "--dual_xent_threshold", "20",
            "--num_output_shards", "2", "--unit_pairs", "8", "--device", "cpu", *extra]


def _rows(run_dir, table="paraphrases", manifest="_manifest.json"):
    files = committed_files(run_dir, table, manifest)
    rows = storage.parquet_dataset(files).to_table().to_pylist() if files else []
    return sorted(rows, key=lambda r: (r["pair_id"], r.get("rank") or 0, r["input_index"]))


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k not in _FLOATS} == {k: v for k, v in y.items() if k not in _FLOATS}
        for k in _FLOATS:
            assert (x[k] is None) == (y[k] is None) and (x[k] is None or abs(x[k] - y[k]) < 1e-4)


@pytest.fixture(scope="module")
def local_runs(tiny_nmt_models, tmp_path_factory):
    """The reference: the same jobs on a local disk."""
    from tests.toydata import toy_bitext

    root = tmp_path_factory.mktemp("local")
    inp = root / "toy.tsv"
    inp.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:30]))
    (root / "cfg.yaml").write_text(FILTER_CONFIG)
    gen = str(root / "gen")
    generate(_gen_args(str(inp), gen, os.path.join(tiny_nmt_models, "cs-en"), os.path.join(tiny_nmt_models, "en-cs")))
    filter_job.run(["--input", gen, "--output", str(root / "filtered"), "--config", str(root / "cfg.yaml")])
    train_embeddings(["--input", gen, "--output", str(root / "enc"), "--encoder", "word+trigram", "--dim", "16",
                      "--epochs", "2", "--no_progress"])
    return root


@pytest.fixture(params=["s3", "gcs"])
def bucket(request, tmp_path, monkeypatch, tiny_nmt_models, local_runs):
    """A bucket on a real server holding the input, the filter config and the two models; the
    environment (also inherited by Dask workers started after this) points at the server."""
    store = request.getfixturevalue(f"{request.param}_store")
    for k, v in store.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PARAGEN_CACHE", str(tmp_path / "cache"))
    root = f"{store.scheme}://{store.make_bucket()}"
    storage.copy_file(str(local_runs / "toy.tsv"), f"{root}/bitext/toy.tsv")
    storage.copy_file(str(local_runs / "cfg.yaml"), f"{root}/cfg.yaml")
    for name in ("cs-en", "en-cs"):
        d = os.path.join(tiny_nmt_models, name)
        for f in os.listdir(d):
            storage.copy_file(os.path.join(d, f), f"{root}/models/{name}/{f}")
    return root


def _bucket_generation(bucket, out, *extra):
    return generate(_gen_args(f"{bucket}/bitext/toy.tsv", out, f"{bucket}/models/cs-en", f"{bucket}/models/en-cs",
                              *extra))


@pytest.mark.slow
@pytest.mark.parametrize("bucket", ["s3", "gcs", "hdfs"], indirect=True)
def test_generation_filter_and_embeddings_on_a_bucket(bucket, local_runs, tmp_path):
    from models.sentence.sentence_encoder import load_encoder

    gen = f"{bucket}/runs/gen"
    manifest = _bucket_generation(bucket, gen)
    assert manifest["counts"]["reconciled"] and manifest["models"]["forward"]["path"].startswith(bucket)
    assert all(f.startswith(gen) for f in committed_files(gen, "paraphrases"))
    assert _rows(gen)
    _same(_rows(gen), _rows(str(local_runs / "gen")))
    _same(_rows(gen, "rejects"), _rows(str(local_runs / "gen"), "rejects"))
    assert not storage.exists(f"{gen}/_work") and not claim_record(gen)
    assert not any(os.path.exists(f"{s}:") for s in ("s3", "gs", "webhdfs"))     # nothing written to a local "s3:/..."

    filtered = f"{bucket}/runs/filtered"
    fm = filter_job.run(["--input", gen, "--output", filtered, "--config", f"{bucket}/cfg.yaml"])
    assert fm["reconciled"] and fm["files"]["fitted"] and storage.isfile(f"{filtered}/report/{fm['run_id']}/report.md")
    cols = ("pair_id", "rank", "keep", "reasons", "trigram_overlap")
    assert [{k: r[k] for k in cols} for r in _rows(filtered, "scored", "_filter_manifest.json")] == \
           [{k: r[k] for k in cols} for r in _rows(str(local_runs / "filtered"), "scored", "_filter_manifest.json")]

    enc = f"{bucket}/runs/enc"
    train_embeddings(["--input", gen, "--output", enc, "--encoder", "word+trigram", "--dim", "16", "--epochs", "2",
                      "--no_progress"])
    assert storage.isfile(f"{enc}/config.json") and storage.isfile(f"{enc}/weights.pt")
    sentences = ["A man is sitting in the park .", "A dog runs on the beach ."]
    assert np.allclose(load_encoder(enc).encode(sentences), load_encoder(str(local_runs / "enc")).encode(sentences),
                       atol=1e-5)


@pytest.mark.slow
def test_generation_on_a_dask_cluster_with_a_bucket(bucket, local_runs, dask_cluster):
    gen = f"{bucket}/runs/dask"
    manifest = _bucket_generation(bucket, gen, "--runner", "DaskRunner", "--dask_client_address", dask_cluster,
                                  "--dask_npartitions", "2")
    assert manifest["runner"] == "DaskRunner" and manifest["counts"]["reconciled"]
    _same(_rows(gen), _rows(str(local_runs / "gen")))


@pytest.mark.slow
def test_a_model_changed_in_the_bucket_during_a_run_is_refused(bucket, tmp_path):
    """Workers check the copies they load against the sha256 the driver recorded."""
    from models.safety import UnsafeModelError
    from models.nmt.model_files.model_dir import check_model_dir, local_model_dir

    model = f"{bucket}/models/cs-en"
    recorded = check_model_dir(model)["sha256"]
    spm = storage.read_bytes(f"{model}/spm.model")
    storage.write_bytes(f"{model}/spm.model", spm + b"\0")            # replaced after the driver's check
    with pytest.raises(UnsafeModelError, match="spm.model changed since the job started"):
        local_model_dir(model, recorded)
