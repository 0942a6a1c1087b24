"""Every GPU of a machine: the worker processes that share a machine's GPUs each claim one
(models/nmt/devices.py), the DirectRunner gets GPUs x processes-per-GPU workers, batch budgets
follow the device's memory. Tested on a CPU through what each process is assigned."""
import os
import subprocess
import sys
import textwrap

import pytest

from beam_pipelines.generation.devices import gpu_worker_processes, hashed_precision
from models.nmt.devices import CPU_SAMPLE_TOKENS, CPU_SCORE_TOKENS, batch_budgets, claim_gpu
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CLAIMER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from models.nmt.devices import claim_gpu
    print(claim_gpu({gpus}, {per_gpu}, {slots!r}), claim_gpu({gpus}, {per_gpu}, {slots!r}), flush=True)
    sys.stdin.read()                     # hold the slot until the test closes stdin
""")


def _start(tmp_path, gpus, per_gpu):
    code = _CLAIMER.format(root=ROOT, gpus=gpus, per_gpu=per_gpu, slots=str(tmp_path / "slots"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first, again = proc.stdout.readline().split()
    assert first == again                                   # a process keeps its GPU
    return proc, int(first)


def test_processes_spread_evenly_over_the_gpus_and_free_slots_are_reused(tmp_path):
    procs = [_start(tmp_path, gpus=2, per_gpu=2) for _ in range(4)]
    assert sorted(gpu for _, gpu in procs) == [0, 0, 1, 1]
    extra, _ = _start(tmp_path, gpus=2, per_gpu=2)          # a fifth: every slot held, still a valid GPU
    # A worker that ends (or is killed) frees its slot for the next one.
    gone, gone_gpu = procs.pop(1)
    gone.kill()
    gone.wait()
    again, gpu = _start(tmp_path, gpus=2, per_gpu=2)
    assert gpu == gone_gpu
    for proc, _ in [*procs, (extra, None), (again, None)]:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_one_gpu_per_process_means_gpu_zero(tmp_path):
    assert claim_gpu(1, 1, str(tmp_path)) == 0
    with pytest.raises(ValueError, match="no GPU"):
        claim_gpu(0, 4, str(tmp_path))


def test_direct_runner_gets_gpus_times_processes_unless_the_user_chose():
    args = gpu_worker_processes(["--runner", "DirectRunner"], "DirectRunner", 3)
    at = args.index("--direct_num_workers")
    assert args[args.index("--direct_running_mode") + 1] == "multi_processing"
    assert int(args[at + 1]) == max(1, _gpus()) * 3
    mine = ["--direct_running_mode", "in_memory"]
    assert gpu_worker_processes(mine, "DirectRunner", 3) == mine
    assert gpu_worker_processes(["--direct_num_workers", "2"], "DirectRunner", 3) == ["--direct_num_workers", "2"]
    dataflow = ["--runner", "DataflowRunner"]
    assert gpu_worker_processes(dataflow, "DataflowRunner", 3) == dataflow     # its launcher sets its own


def _gpus():
    import torch
    return torch.cuda.device_count()


def test_config_hash_records_what_auto_precision_became_on_a_gpu():
    assert hashed_precision("auto", "cpu", "fp32") == "auto"            # unchanged: CPU runs keep their hash
    assert hashed_precision("auto", None, "auto") == "auto"
    assert hashed_precision("bf16", "cuda", "bf16") == "bf16"
    assert hashed_precision("auto", "cuda", "bf16") != hashed_precision("auto", "cuda", "fp16")


def test_batch_budgets_grow_with_the_gpus_memory_and_stay_bounded():
    assert batch_budgets("cpu") == (CPU_SCORE_TOKENS, CPU_SAMPLE_TOKENS)
    gib = 1 << 30
    small = batch_budgets("cuda", 8 * gib, layers=6, dim=512, vocab=8_000, element_bytes=2)
    large = batch_budgets("cuda", 40 * gib, layers=6, dim=512, vocab=8_000, element_bytes=2)
    fp32 = batch_budgets("cuda", 40 * gib, layers=6, dim=512, vocab=8_000, element_bytes=4)
    assert small[0] > CPU_SCORE_TOKENS and small[1] > CPU_SAMPLE_TOKENS
    assert large[0] > small[0] and large[1] > small[1]
    assert fp32[1] < large[1]                                   # wider elements, fewer tokens
    huge = batch_budgets("cuda", 10_000 * gib, layers=6, dim=512, vocab=8_000)
    assert huge == (2_000_000, 20_000_000)
    # A budget's logits and caches fit in the share it was sized for (half of it).
    score_tokens, sample_tokens = large
    assert score_tokens * 8_000 * 12 <= 20 * gib
    assert sample_tokens * 6 * 2 * 512 * 2 <= 20 * gib


# what torch answers on a machine with an A100 (the worker never decodes: it is asked, then refused)
_AMPERE = '''
import torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda device=None: (8, 0)
torch.cuda.get_device_name = lambda device=None: "NVIDIA A100-SXM4-80GB"
'''


@pytest.mark.slow
def test_dask_workers_that_would_decode_in_two_precisions_are_refused_before_anything_is_written(
        tmp_path, tiny_nmt_models):
    """--precision auto is resolved on each worker of a running Dask cluster, before the run writes
    anything: a fleet of a CPU worker (fp32) and an A100 worker (tf32, torch's answers set in its
    process) is refused in one line naming both; --device cpu (fp32 on every worker) runs, and
    its manifest records the precision the workers resolved."""
    from tests.dask_cluster import local_dask_cluster
    from tests.jobs import quick_args

    from tests.toydata import toy_bitext

    bitext_file = tmp_path / "toy.tsv"
    bitext_file.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:16]))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_AMPERE)
    ampere = {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    out = tmp_path / "out"
    with local_dask_cluster(str(tmp_path / "dask"), worker_envs=[{}, ampere]) as address:
        args = [a for a in quick_args(bitext_file, out, tiny_nmt_models) if a not in ("--device", "cpu")]
        args += ["--runner", "DaskRunner", "--dask_client_address", address]
        done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT,
                               capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
        assert "would decode in different precisions (1 in fp32 on cpu; 1 in tf32 on cuda (NVIDIA A100-SXM4-80GB))" \
            in errors[0], errors
        assert not out.exists()                                  # refused before anything was written
        done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args, "--device", "cpu"], cwd=ROOT,
                               capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    manifest = json.load(open(out / "_manifest.json"))
    precision = manifest["precision"]
    # which of the two workers got units is Dask's choice (under load one may take them all): the
    # manifest counts the workers that decoded, all in fp32 on a CPU, and every planned unit's precision
    assert precision["resolved"] == "fp32" and not precision["mixed"]
    assert set(precision["workers"]) == {"cpu_fp32"} and precision["workers"]["cpu_fp32"] in (1, 2), precision
    assert precision["units"] == {"fp32": manifest["units"]["planned"]}, (precision, manifest["units"])
