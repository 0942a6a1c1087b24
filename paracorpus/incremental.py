"""Incremental generation: what a run can take from the previous committed run.

A refresh runs the generation job with ``--previous RUN``. Every input shard whose content (sha256)
and whose effective config (the config hash: models, preset, every setting that changes output,
decoding limits included) are those of the previous run is never decoded again. Its rows stay
where they are when its whole bin (paracorpus/bins.py: input shards packed so files follow the
file target) is unchanged and full: the new manifest lists that bin's files, by a path into the
run that holds them. Otherwise (a shard of its bin changed or went away, or the bin is the
under-full last one) the shard is *carried*: compaction copies its rows out of the old files
into the new bins' files (paracorpus/compaction.py). New and changed shards are decoded; their
pairs are deduplicated against the dedup keys the previous run kept for the reused shards (a
table in the run, ``dedup/``, not recomputed from text), so a pair already published keeps its
place and a new copy of it is a ``duplicate`` reject. Shards that are gone drop out. The manifest
says, per input shard, which run decoded it and which bin holds its rows. A run of contract 3
(before bins) is read as one bin per input shard.

Content hashes are taken without reading a shard again when its paths, sizes and modification
times are those the previous run recorded (the quick check of rsync and make); anything else is
hashed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common import storage
from common.cli import UsageError
from paracorpus.schema import CONTRACT_VERSION, MANIFEST, table_relative
from common.shards import ShardSpec
from paracorpus.bins import bin_id, is_full

TABLES = ("paraphrases", "rejects", "dedup")


def shard_versions(spec: ShardSpec) -> list:
    """[(path, size, mtime ns)] of SPEC's files: what the quick check compares."""
    return [[p, *storage.stat(p)] for p in spec.paths]


def fingerprint(spec: ShardSpec, previous: dict | None) -> dict:
    """{"versions", "sha256"} of SPEC: the previous run's sha256 when the quick check passes (same
    paths, sizes and times as PREVIOUS recorded), else hashed now."""
    versions = shard_versions(spec)
    if previous and previous.get("versions") == versions and previous.get("sha256"):
        return {"versions": versions, "sha256": previous["sha256"]}
    return {"versions": versions, "sha256": [storage.sha256(p) for p in spec.paths]}


@dataclass
class Reuse:
    """What a run takes from the previous one (all empty when there is none to take from)."""
    previous: str | None = None                  # the previous run's directory or URL
    previous_run_id: str | None = None
    why_not: str | None = None                   # why nothing is reused, when nothing is
    reused: dict = field(default_factory=dict)   # shard name -> previous manifest's inputs entry (not decoded)
    carried: dict = field(default_factory=dict)  # shard name -> its previous bin: reused, rows copied to new files
    kept_files: dict = field(default_factory=lambda: {t: [] for t in TABLES})   # files of the bins kept as they are
    copy_from: dict = field(default_factory=dict)     # previous bin -> {table: files} its carried rows are in
    decode: list = field(default_factory=list)   # ShardSpecs to read and decode
    removed: list = field(default_factory=list)  # shard names the previous run had, this one has not
    fingerprints: dict = field(default_factory=dict)   # shard name -> {"versions", "sha256"}

    @property
    def nothing_to_do(self) -> bool:
        """True when every shard is reused and none was removed: the run would be the previous one."""
        return self.previous is not None and not self.decode and not self.removed

    def carried_from(self, old_bin: str) -> list[str]:
        return sorted(n for n, b in self.carried.items() if b == old_bin)

    def dedup_sources(self) -> list[tuple[dict, list | None]]:
        """(previous manifest entry of a dedup file, the input shards whose rows count or None for
        all): the dedup keys of every shard this run reuses."""
        out = [(f, None) for f in self.kept_files["dedup"]]
        for old_bin, files in sorted(self.copy_from.items()):
            out += [(f, self.carried_from(old_bin)) for f in files["dedup"]]
        return out


def check_previous(previous: str) -> dict:
    """The committed generation manifest of the run PREVIOUS, checked; UsageError otherwise."""
    path = storage.join(previous, MANIFEST)
    if not storage.isfile(path):
        raise UsageError(f"--previous {previous}: no {MANIFEST}, so no committed run to build on "
                         "(unfinished, failed, or not a generation run)")
    try:
        manifest = storage.read_json(path)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"--previous {previous}: {MANIFEST} is not valid JSON ({str(exc)[:100]})") from None
    if not isinstance(manifest, dict):
        raise UsageError(f"--previous {previous}: {MANIFEST} is not a generation run's manifest (not an object)")
    missing = [k for k in ("run_id", "config_hash", "inputs", "files") if k not in manifest]
    if missing or not isinstance(manifest["inputs"], list) or not isinstance(manifest["files"], dict):
        raise UsageError(f"--previous {previous}: {MANIFEST} is not a generation run's manifest "
                         f"(lacks {missing or 'a list of inputs and a map of files'})")
    return manifest


def _from_contract_3(manifest: dict) -> dict:
    """MANIFEST of contract 3 (files per input shard, no bins) as contract 4 reads it: each input
    shard a bin of its own, each file entry with its bin and output partition. The files' columns
    are the same, so a run written before bins is built on, not decoded again."""
    inputs = [{**e, "bin": bin_id([e["input_shard"]])} for e in manifest["inputs"]
              if isinstance(e, dict) and "input_shard" in e]
    files = {table: [{**f, "bin": bin_id([f.get("input_shard", "")]),
                      "shard": int(table_relative(f["path"], table).split("/")[1])} for f in entries]
             for table, entries in manifest["files"].items() if table in TABLES}
    return {**manifest, "inputs": inputs, "files": files, "contract_version": CONTRACT_VERSION}


def plan_reuse(previous: str | None, shards: list[ShardSpec], config_hash: str, capacity: int) -> Reuse:
    """Which SHARDS the run can take from the committed run PREVIOUS (see the module doc), with bins
    of CAPACITY records (paracorpus/bins.py). UsageError when PREVIOUS holds no committed generation run."""
    previous_manifest = check_previous(previous) if previous else None
    if previous_manifest and previous_manifest.get("contract_version") == 3:
        try:
            previous_manifest = _from_contract_3(previous_manifest)
        except (KeyError, ValueError, IndexError, TypeError, AttributeError):
            raise UsageError(f"--previous {previous}: {MANIFEST} (contract 3) lists files this job cannot place "
                             "(an entry without a path or input shard, or outside a table's partitions)") from None
    before = {e["input_shard"]: e for e in (previous_manifest or {}).get("inputs", [])
              if isinstance(e, dict) and "input_shard" in e}
    reuse = Reuse(previous=storage.absolute(previous) if previous_manifest else None,
                  previous_run_id=(previous_manifest or {}).get("run_id"))
    reuse.fingerprints = {s.name: fingerprint(s, before.get(s.name)) for s in shards}
    if previous_manifest and previous_manifest.get("contract_version") != CONTRACT_VERSION:
        reuse.why_not = (f"run {previous_manifest.get('run_id')} was written under contract "
                         f"{previous_manifest.get('contract_version')} (this job writes {CONTRACT_VERSION}), "
                         "whose files are laid out differently")
    elif previous_manifest and previous_manifest.get("config_hash") != config_hash:
        reuse.why_not = (f"the config changed since run {previous_manifest.get('run_id')} "
                         f"({previous_manifest.get('config_hash')} -> {config_hash})")
    elif previous_manifest and not all("counts" in e and "bin" in e for e in before.values()):
        reuse.why_not = f"run {previous_manifest.get('run_id')} has no per-shard counts or bins (an older contract)"
    if reuse.why_not or previous_manifest is None:
        reuse.previous, reuse.decode = None, list(shards)
        return reuse
    names = {s.name for s in shards}
    unchanged = set()
    for spec in shards:
        entry = before.get(spec.name)
        if entry and entry.get("sha256") == reuse.fingerprints[spec.name]["sha256"]:
            unchanged.add(spec.name)
            reuse.reused[spec.name] = entry
        else:
            reuse.decode.append(spec)
    reuse.removed = sorted(n for n in before if n not in names)
    members: dict = {}
    for name, entry in before.items():
        members.setdefault(entry["bin"], []).append(name)
    files_of: dict = {}
    for table in TABLES:
        for f in previous_manifest.get("files", {}).get(table, []):
            # a file no input's bin claims would be dropped from the new run without a word
            if not (isinstance(f, dict) and isinstance(f.get("path"), str) and f.get("bin") in members
                    and isinstance(f.get("shard"), int) and isinstance(f.get("rows"), int)):
                raise UsageError(f"--previous {previous}: {MANIFEST} lists a {table} file that no input shard's bin "
                                 f"holds, or without its path, partition or rows: {str(f)[:200]}")
            files_of.setdefault(f["bin"], {t: [] for t in TABLES})[table].append(f)
    for old_bin, names_in in sorted(members.items()):
        files = files_of.get(old_bin, {t: [] for t in TABLES})
        if all(n in unchanged for n in names_in) and is_full([before[n]["records_read"] for n in names_in], capacity):
            for table in TABLES:
                reuse.kept_files[table] += files[table]
            continue
        carried = [n for n in names_in if n in unchanged]
        for n in carried:
            reuse.carried[n] = old_bin
        if carried:
            reuse.copy_from[old_bin] = files
    return reuse
