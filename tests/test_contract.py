"""docs/contract.md documents the output contract exactly as paracorpus/schema.py defines it."""
import os

from paracorpus.schema import (CONTRACT_VERSION, PARAPHRASE_COLUMNS, PARAPHRASE_SCHEMA, REJECT_COLUMNS, REJECT_REASONS,
                               markdown_table)

CONTRACT_DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "contract.md")


def test_contract_doc_has_the_column_tables():
    text = open(CONTRACT_DOC, encoding="utf-8").read()
    assert markdown_table(PARAPHRASE_COLUMNS) in text
    assert markdown_table(REJECT_COLUMNS) in text
    for reason in REJECT_REASONS:
        assert f"`{reason}`" in text


def test_schema_has_the_columns_the_issue_requires():
    required = {"pair_id", "src_lang", "tgt_lang", "source", "reference", "paraphrase", "rank", "cluster_id",
                "cluster_size", "forward_nll", "backward_nll", "combined_score", "constraint_set",
                "num_sampled", "num_surviving", "mode", "config_hash"}
    assert required <= set(PARAPHRASE_SCHEMA.names)
    assert PARAPHRASE_SCHEMA.metadata[b"contract_version"] == str(CONTRACT_VERSION).encode()


def test_row_builders_fail_where_the_row_is_made():
    import pytest

    from paracorpus.cleaning import CleanPair
    from paracorpus.schema import REJECT_TEXT_CHARS, REJECTS, ContractError, reject_row

    good = dict(pair_id="p", input_shard="s.tsv", input_index=3, stage="clean", reason="empty_src",
                detail=None, source=None, reference="x", config_hash="h")
    row = REJECTS.row(**good)
    assert list(row) == REJECTS.names and row["lang_pair"] is None            # partition columns come later
    with pytest.raises(ContractError, match=r"no column\(s\) \['reasn'\]"):
        REJECTS.row(**{**good, "reasn": "x"})
    with pytest.raises(ContractError, match=r"required column\(s\) \['reason'\]"):
        REJECTS.row(**{**good, "reason": None})
    # the one builder every stage uses: a record dict or a CleanPair, long sides cut
    record = {"pair_id": "p", "input_shard": "s.tsv", "input_index": 3, "source": None, "reference": "x"}
    assert reject_row(record, "clean", "empty_src", None, "h") == row
    long = CleanPair("p", "s.tsv", 3, "y" * 5000, "x")
    cut = reject_row(long, "segment", "too_many_pieces_src", "5000 pieces > 250", "h")
    assert cut["source"] == "y" * REJECT_TEXT_CHARS and cut["stage"] == "segment"
    with pytest.raises(ContractError, match="required"):
        reject_row(record, "clean", None, None, "h")
    table = REJECTS.partitioned([row], "cs-en", 7)
    assert table.schema == REJECTS.schema and table.to_pylist()[0]["shard"] == 7
