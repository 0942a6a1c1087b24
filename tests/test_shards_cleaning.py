"""Reading hostile shards and cleaning pairs: every record is either a pair or a reasoned reject."""
import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paracorpus.cleaning import CleaningConfig, Rejection, clean_pair, dedup_key, normalize_text, pair_id
from paracorpus.constraints import constraint_words, draw_constraint_sets
from common.shards import ShardSpec, discover_shards, read_shard


def _records(spec, **kw):
    return list(read_shard(spec, **kw))


def test_tsv_shard_with_hostile_lines(tmp_path):
    path = tmp_path / "bad.tsv"
    lines = [b"Pes b\xc4\x9b\xc5\xbe\xc3\xad .\tA dog runs .",       # fine
             b"spatn\xe9 k\xf3dov\xe1n\xed\tbad latin-2 bytes",     # invalid UTF-8
             b"no tab here",                                        # missing column
             b"a\tb\tc",                                            # extra column
             b"x" * 100_000 + b"\ty",                               # overlong line
             b"\tEmpty source ."]
    path.write_bytes(b"\n".join(lines) + b"\n")
    recs = _records(ShardSpec("tsv", (str(path),), "bad.tsv"), max_line_chars=20_000)
    assert [r.index for r in recs] == list(range(6))
    assert [r.error for r in recs] == [None, "bad_utf8", "missing_column", "extra_column", "overlong_line", None]
    assert recs[0].source == "Pes běží ." and recs[0].reference == "A dog runs ."
    assert len(recs[4].source) <= 1000          # rejects keep only a bounded snippet
    assert recs[5].source == ""


def test_overlong_line_is_not_held_in_memory(tmp_path):
    path = tmp_path / "huge.tsv.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"a" * 3_000_000 + b"\tb\nok\tfine\n")
    recs = _records(ShardSpec("tsv", (str(path),), "huge.tsv.gz"), max_line_chars=1000)
    assert [r.error for r in recs] == ["overlong_line", None]
    assert recs[1].source == "ok"


def test_moses_pair_files_and_uneven_lengths(tmp_path):
    (tmp_path / "c.cs").write_text("jedna\ndva\ntři\n", encoding="utf-8")
    (tmp_path / "c.en.gz").write_bytes(gzip.compress("one\ntwo\n".encode()))
    specs = discover_shards([str(tmp_path / "c")], "cs", "en")
    assert len(specs) == 1 and specs[0].format == "moses" and specs[0].name == "c"
    recs = _records(specs[0])
    assert [(r.source, r.reference, r.error) for r in recs[:2]] == [("jedna", "one", None), ("dva", "two", None)]
    assert recs[2].error == "missing_column"


def test_parquet_shard_nulls_and_missing_columns(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"cs": ["ahoj", None, "nazdar"], "en": ["hello", "x", None]}), path)
    recs = _records(ShardSpec("parquet", (str(path),), "p.parquet"), src_column="cs", tgt_column="en")
    assert [r.error for r in recs] == [None, "missing_column", "missing_column"]
    with pytest.raises(ValueError, match="lacks column"):
        _records(ShardSpec("parquet", (str(path),), "p.parquet"), src_column="src", tgt_column="tgt")
    numbers = tmp_path / "n.parquet"
    pq.write_table(pa.table({"cs": ["ahoj"], "en": [42]}), numbers)
    with pytest.raises(ValueError, match="'en' is int64, not text"):
        _records(ShardSpec("parquet", (str(numbers),), "n.parquet"), src_column="cs", tgt_column="en")


def test_discover_rejects_missing_inputs_and_twinless_moses(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no file"):
        discover_shards([str(tmp_path / "nothing")], "cs", "en")
    (tmp_path / "lonely.cs").write_text("x\n")
    with pytest.raises(FileNotFoundError, match="twin"):
        discover_shards([str(tmp_path / "lonely.cs")], "cs", "en")


def test_cleaning_rules():
    cfg = CleaningConfig(src_lang="cs", tgt_lang="en", max_tokens=10, max_length_ratio=3.0)
    assert clean_pair("  Pes \u201eběží\u201c\u2026 ", "A  dog \u2019s run\u2014fast", cfg) == \
        ('Pes "běží"...', "A dog 's run-fast")
    assert clean_pair("a", " ", cfg).reason == "empty_tgt"
    assert clean_pair("", "b", cfg).reason == "empty_src"
    assert clean_pair("a\x07b", "c", cfg).reason == "control_chars"
    # Bidi overrides / isolates and tag characters hide or reorder text: rejected even when no
    # encoding rule would catch them.
    no_rule = CleaningConfig(encodings={"cs": "", "en": ""})
    for hidden in ("\u202e", "\u2066", "\U000e0041"):
        rej = clean_pair("pes", f"dog{hidden}cat", no_rule)
        assert rej.reason == "control_chars" and f"U+{ord(hidden):04X}" in rej.detail
    assert clean_pair("pes\u200f", "\u200edog", no_rule) == ("pes", "dog")    # direction marks dropped
    assert clean_pair("Пес", "dog", cfg).reason == "not_encodable_src"        # Cyrillic is not latin-2
    assert clean_pair("pes", "dog ☺", cfg).reason == "not_encodable_tgt"
    assert clean_pair("ř", "ř", CleaningConfig(encodings={"en": ""})) == ("ř", "ř")   # rule disabled
    assert clean_pair(" ".join(["a"] * 11), "b", cfg).reason == "too_long_src"
    assert clean_pair("a b c d e f g h i j", "x y", cfg).reason == "length_ratio"
    assert isinstance(clean_pair("Ano .", "Yes , indeed .", cfg), tuple)       # short pairs skip ratio
    assert isinstance(clean_pair("a", "b", cfg), tuple) and not isinstance(clean_pair("a", "b", cfg), Rejection)


def test_normalize_and_ids_are_stable():
    assert normalize_text("a\u200bb\u00a0c") == "ab c"
    # Pinned: ids are part of the output contract, so they must not change between processes or
    # releases (a salted hash() or a new digest would break joins with earlier runs).
    assert pair_id("s.tsv", 3, "a", "b") == "80bd0a65358c8306"
    assert len({pair_id("s.tsv", 3, "a", "b"), pair_id("s.tsv", 4, "a", "b"),
                pair_id("t.tsv", 3, "a", "b"), pair_id("s.tsv", 3, "a", "c")}) == 4
    assert dedup_key("Pes", "A dog") == dedup_key("pes", "a DOG")


def test_constraint_sets_are_seeded_distinct_and_from_reference():
    ref = "A man in a red shirt is riding a bike ."
    words = constraint_words(ref)
    assert words == ["A", "man", "in", "red", "shirt", "is", "riding", "bike"]
    sets = draw_constraint_sets(ref, 5, seed=7, pair_id="p1", max_words=3)
    assert sets == draw_constraint_sets(ref, 5, seed=7, pair_id="p1", max_words=3)
    assert sets != draw_constraint_sets(ref, 5, seed=8, pair_id="p1", max_words=3)
    assert len(set(sets)) == 5
    assert all(1 <= len(s) <= 3 and set(s) <= set(words) for s in sets)
    assert draw_constraint_sets("... !", 2, 1, "p") == [(), ()]
