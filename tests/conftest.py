"""Shared fixtures: tiny fairseq models trained once per test session on synthetic bitext, and a
real dask.distributed cluster on loopback."""
import logging
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TINY = dict(vocab_size=200, layers=1, dim=64, ffn_dim=128, heads=2, max_epoch=8, max_tokens=2048,
            lr=3e-3, dropout=0.0, warmup=30, valid_size=50, bleu_samples=50,
            cpu_threads=1)  # one thread: several times faster than two when the CPUs are shared


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: trains a model or runs a pipeline end to end (deselect with -m 'not slow')")
    from tests.leaks import SESSION_ENV

    if not hasattr(config, "workerinput"):          # the run's first process: xdist's workers inherit it
        import uuid

        os.environ[SESSION_ENV] = uuid.uuid4().hex
        # Every temporary file a test's processes make (Beam's pipeline and job-server folders, the
        # logs of deploy/run_dask.sh --local, a killed job's leftovers) goes to one folder of this
        # run, removed at its end: the suite leaves nothing in /tmp. pytest's own tmp_path folders
        # stay where they were (the last three runs kept, to look into a failure).
        import tempfile

        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
        os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="paragen-tests-")
        config._paragen_tmpdir = os.environ["TMPDIR"]
        tempfile.tempdir = None                     # gettempdir() reads TMPDIR again
        # One OpenMP/MKL thread a process unless a test asks for more (--torch_threads): two xdist
        # workers share two cores, and a second thread per process only spin-waits for the other
        # worker's (a job ran 25% faster, CPU time too, beside one busy process).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MKL_NUM_THREADS", "1")
        _compile_sources()
    # xdist hands out whole files (--dist loadfile); by default it starts with the files of most
    # tests, which are quick, and leaves the slow ones of few tests to the end, where one worker
    # then runs alone. Slowest first instead (pytest_collection_modifyitems).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _compile_sources() -> None:
    """The project's modules compiled to __pycache__ once, before any test: where
    PYTHONDONTWRITEBYTECODE is set (CI's machines set it), every process the suite starts (about 700)
    would otherwise compile each module it imports again, 0.3 s of CPU a job."""
    import compileall

    for name in ("beam_pipelines", "common", "deploy", "embeddings", "filtering", "models", "paracorpus",
                 "transforms", "tests", "bench", "scripts"):
        folder = os.path.join(ROOT, name)
        if os.path.isdir(folder):
            compileall.compile_dir(folder, quiet=1, workers=1)


# Test files by their total time in a whole run (docs/testing.md, "Where the time goes"), slowest
# first; a file not named here comes after them in its usual order. Only the run's length depends
# on this list.
SLOWEST_FIRST = ("test_crash_points", "test_faults", "test_flink", "test_batch_independence", "test_bench_smoke",
                 "test_slurm_workers", "test_common_mistakes", "test_fairseq_fixtures", "test_slurm",
                 "test_buckets_end_to_end", "test_model_import", "test_incremental", "test_store_away_at_commit", "test_commit_and_resume",
                 "test_generation_reruns", "test_one_writer", "test_generate_pipeline", "test_ct2_engine",
                 "test_stopping_instants", "test_compaction", "test_fixed_sampler", "test_unreachable_stores",
                 "test_hostile_input", "test_ct2_transformers", "test_worker_fencing", "test_fencing",
                 "test_checkpoint_safety")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: at for at, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))        # stable: keeps order within a file


def pytest_sessionfinish(session, exitstatus):
    """A process a test started and left running fails the run (tests/leaks.py), once every
    worker's fixtures are torn down."""
    from tests.leaks import SESSION_ENV, end, leftovers

    if hasattr(session.config, "workerinput") or not os.environ.get(SESSION_ENV):
        return
    left = leftovers(os.environ[SESSION_ENV])
    end(left)
    tmpdir = getattr(session.config, "_paragen_tmpdir", None)
    if tmpdir:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) a test started were still running at the end (ended now):"]
    lines += [f"  {pid}: {cmd}" for pid, cmd in sorted(left.items())]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def built_once(tmp_path_factory, name: str, load, build):
    """LOAD(folder) of what BUILD(folder) made under this test run's NAME, built by the first
    process that asks: xdist's workers share one folder of the run (under a file lock), so the
    tiny models and fixtures are made once per run, not once per worker."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent                  # the run's folder; each worker's is popen-gwN under it
    folder = str(base / name)
    with FileLock(folder + ".lock"):
        got = load(folder)
        return got if got is not None else build(folder)


@pytest.fixture(scope="session", autouse=True)
def _warm_interpreter_stopped():
    """The job zygote this worker started (tests/warm_python.py), stopped with its session, before
    the run looks for processes left behind."""
    yield
    from tests import warm_python

    warm_python.stop()


@pytest.fixture(scope="session")
def tiny_nmt_models(tmp_path_factory):
    """OUT dir with cs-en/ and en-cs/ model dirs (python -m models.nmt.train layout)."""
    from models.nmt.train import train_models
    from tests.toydata import toy_bitext

    reuse = os.environ.get("PARAGEN_TEST_MODELS")    # a directory this fixture made before (for development)
    if reuse and os.path.isfile(os.path.join(reuse, "cs-en", "model.pt")):
        return reuse

    def load(folder):
        return folder if os.path.isfile(os.path.join(folder, ".built")) else None

    def build(folder):
        train_models(toy_bitext(1500, seed=0), folder, "cs", "en", **TINY)
        open(os.path.join(folder, ".built"), "w").close()
        return folder
    return built_once(tmp_path_factory, "tiny-nmt", load, build)


@pytest.fixture(scope="session")
def fwd(tiny_nmt_models):
    """The tiny cs-en model, loaded once (the process-wide cache the job uses too)."""
    from models.nmt.engines.fairseq_engine import load_translator

    return load_translator(os.path.join(tiny_nmt_models, "cs-en"), device="cpu")


@pytest.fixture(scope="session")
def bwd(tiny_nmt_models):
    from models.nmt.engines.fairseq_engine import load_translator

    return load_translator(os.path.join(tiny_nmt_models, "en-cs"), device="cpu")


@pytest.fixture(scope="session")
def sources():
    """Six Czech sources of a toy bitext (seed 3; the tiny models were trained on seed 0)."""
    from tests.toydata import toy_bitext

    return [src for src, _ in toy_bitext(400, seed=3)[:6]]


@pytest.fixture(scope="session")
def fairseq_layouts(tmp_path_factory):
    """{layout name: info dict} (tests/fairseq_fixtures.py), built once per session."""
    from tests.fairseq_fixtures import build_all, layouts_for_tests, load_built

    if os.environ.get("PARAGEN_TEST_FAIRSEQ_LAYOUTS"):
        return layouts_for_tests(tmp_path_factory)
    return built_once(tmp_path_factory, "fairseq-layouts", load_built, build_all)


@pytest.fixture(scope="session")
def transformers_models(tmp_path_factory):
    """{name: info dict} of tiny Marian and M2M-100 models (tests/transformers_fixtures.py),
    built once per session."""
    from tests.transformers_fixtures import build_all, layouts_for_tests, load_built

    if os.environ.get("PARAGEN_TEST_TRANSFORMERS_MODELS"):
        return layouts_for_tests(tmp_path_factory)
    return built_once(tmp_path_factory, "transformers-models", load_built, build_all)


@pytest.fixture(scope="session")
def hub():
    """LAYOUT -> fairseq's GeneratorHubInterface for it, loaded once, as users load it."""
    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    from fairseq.models.transformer import TransformerModel

    loaded = {}

    def load(info):
        key = info["source"]
        if key not in loaded:
            logging.getLogger("fairseq").setLevel(logging.WARNING)
            loaded[key] = TransformerModel.from_pretrained(**info["hub_kwargs"]).eval()
        return loaded[key]

    return load


@pytest.fixture
def dask_cluster(tmp_path):
    """A real scheduler and two worker processes on loopback."""
    from tests.dask_cluster import local_dask_cluster

    with local_dask_cluster(str(tmp_path)) as address:
        yield address