"""Which GPU a decoding process uses, and how much work it puts on it per batch.

A machine's GPUs are shared by its decoding processes: with k GPUs and P processes per GPU, the
DirectRunner starts k x P worker processes (beam_pipelines/generate.py), and each claims a slot
the first time it loads a model (:func:`claim_gpu`): the lowest slot no living process holds, an
exclusive ``flock`` on a file per slot, released by the kernel when the process ends (a killed
worker never leaves a slot taken). Slot s decodes on GPU s mod k, so the processes spread evenly
over the GPUs, and their host work (tokenization, constraint sets, detokenization, clustering,
Parquet) overlaps the other processes' decoding instead of leaving the GPU idle. Dask workers and
Dataflow/Flink SDK processes that are given one GPU each (``CUDA_VISIBLE_DEVICES``) see k = 1.

Batch budgets (:func:`batch_budgets`) are in the engine's unit, padded source plus output tokens
over a batch's decoder rows: on the CPU the constants that measured fastest there; on a GPU, what
this process's share of the device's memory holds, from the model's size (layers, width,
vocabulary) and the bytes per element of its precision.
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile

log = logging.getLogger("paragen")

# The engines' --precision choices (models/nmt/engines/fairseq_engine.py resolves them); here, without torch,
# so that the command lines can offer them without importing it.
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")
# ... and sampling's step modes (models/nmt/decoding/fixed_sampler.py).
STEP_MODES = ("auto", "tree", "fixed", "compiled", "graphs")
CPU_SCORE_TOKENS = 24_000         # beam search and forced decoding: source + output tokens per batch
# Sampled rows share prefixes (models/nmt/decoding/prefix_decoder.py): a sampling batch holds far fewer
# decoder states than rows, so it gets a larger budget (one batch for a typical 64-pair call).
CPU_SAMPLE_TOKENS = 200_000
MAX_SCORE_TOKENS = 2_000_000      # beyond these a batch is no faster, only harder to retry
MAX_SAMPLE_TOKENS = 20_000_000
_HELD: dict = {}                  # slot file descriptors this process holds (for its lifetime)


MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"         # the CUDA driver's default CUDA_MPS_PIPE_DIRECTORY


def under_mps(environ=None) -> bool:
    """Whether this process's CUDA contexts go through an MPS server: a control daemon listens in
    the pipe directory the CUDA driver connects to (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps;
    the daemon's named pipe ``control`` is there while it runs). What a worker records of its GPU
    sharing, on every runner: the daemon may be the job's, a launcher's or an administrator's."""
    environ = os.environ if environ is None else environ
    folder = environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE
    return os.path.exists(os.path.join(folder, "control"))


def slots_dir() -> str:
    """Where the slot files live: $PARAGEN_GPU_SLOTS, else a folder under the temporary directory
    (processes in separate containers need a shared one)."""
    default = os.path.join(tempfile.gettempdir(), f"paragen-gpu-slots-{os.getuid()}")
    return os.environ.get("PARAGEN_GPU_SLOTS") or default


def claim_gpu(n_gpus: int, processes_per_gpu: int, directory: str | None = None) -> int:
    """The GPU index this process decodes on (the same on every call in a process). Takes the
    lowest of n_gpus x processes_per_gpu slots that no living process holds; when all are held
    (more processes than slots), the GPU of this process id."""
    if n_gpus < 1:
        raise ValueError(f"no GPU to claim (n_gpus={n_gpus})")
    key = (os.getpid(), n_gpus)
    if key in _HELD:
        return _HELD[key][1]
    directory = directory or slots_dir()
    os.makedirs(directory, exist_ok=True)
    for slot in range(n_gpus * max(1, processes_per_gpu)):
        fd = os.open(os.path.join(directory, f"slot-{slot:03d}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD[key] = (fd, slot % n_gpus)
        return slot % n_gpus
    gpu = os.getpid() % n_gpus
    log.warning("all %d GPU slots are held by other processes: decoding on GPU %d", n_gpus * processes_per_gpu, gpu)
    _HELD[key] = (None, gpu)
    return gpu


def worker_device(device: str | None, processes_per_gpu: int) -> str:
    """The torch device this worker process decodes on: DEVICE as given when it names a GPU
    ('cuda:1') or the CPU; 'cuda' (or None with a GPU visible) becomes a claimed GPU."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda":
        return device
    gpu = claim_gpu(torch.cuda.device_count(), processes_per_gpu)
    torch.cuda.set_device(gpu)          # what a library allocates without naming a device lands there too
    return f"cuda:{gpu}"


def batch_budgets(device_type: str, memory_bytes: int = 0, layers: int = 6, dim: int = 512, vocab: int = 32_000,
                  element_bytes: int = 2) -> tuple[int, int]:
    """(scoring tokens, sampling tokens) per batch. MEMORY_BYTES: this process's share of the
    GPU's memory, half of which the batches may fill (the rest: weights, the allocator's slack,
    estimates that run short). Scoring holds a batch's logits, their float copy and log-softmax
    (vocabulary x 12 bytes per target token) and layer activations; sampling holds each node's
    self-attention cache (layers x 2 x width per position) and, at a step, its logits (a row's
    vocabulary x 12 bytes spread over the ~20 or more positions it counts for in the budget)."""
    if device_type != "cuda":
        return CPU_SCORE_TOKENS, CPU_SAMPLE_TOKENS
    per_score_token = vocab * 12 + 16 * dim * element_bytes
    per_sample_token = layers * 2 * dim * element_bytes + vocab * 12 // 20
    usable = memory_bytes // 2
    return (max(CPU_SCORE_TOKENS, min(MAX_SCORE_TOKENS, usable // per_score_token)),
            max(CPU_SAMPLE_TOKENS, min(MAX_SAMPLE_TOKENS, usable // per_sample_token)))


def gpu_memory_share(device, processes_per_gpu: int) -> int:
    """Bytes of DEVICE's memory one of its PROCESSES_PER_GPU processes may plan for."""
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    return total // max(1, processes_per_gpu)


__all__ = ["PRECISIONS", "STEP_MODES", "batch_budgets", "claim_gpu", "gpu_memory_share", "slots_dir", "worker_device"]


class DeviceFailure(RuntimeError):
    """A device error that leaves the process unable to compute (CUDA documents that after an
    illegal address, an ECC error or a device-side assert the context is unusable until the
    process ends): the worker must stop, not turn its pairs into rejects."""


_FATAL_DEVICE_WORDS = ("CUDA error", "device-side assert", "illegal memory access", "illegal address",
                       "uncorrectable ECC", "ECC error", "unspecified launch failure", "CUBLAS_STATUS",
                       "CUDNN_STATUS", "NCCL error", "HIP error")


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation failure: the batch may fit when split."""
    import torch

    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


def is_fatal_device_error(exc: BaseException) -> bool:
    """A device error other than running out of memory (see DeviceFailure)."""
    import torch

    if is_out_of_memory(exc):
        return False
    if isinstance(exc, getattr(torch, "AcceleratorError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _FATAL_DEVICE_WORDS)


def release_cached_memory() -> None:
    """Give the device's cached blocks back after an out-of-memory error, before the smaller retry."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
