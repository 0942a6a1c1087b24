"""--where clauses: parsed by Python's tokenizer and ast, checked against a grammar and the
column types, compiled to a pyarrow filter; never evaluated."""
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from paracorpus.where import WhereError, parse_where

SCHEMA = pa.schema([("rank", pa.int32()), ("score", pa.float32()), ("keep", pa.bool_()),
                    ("lang_pair", pa.string()), ("backward_nll", pa.float32()),
                    ("constraint_set", pa.list_(pa.string()))])
TABLE = pa.table({"rank": [1, 2, 3, 4], "score": [0.5, 2.5, 3.5, 1.0], "keep": [True, False, True, True],
                  "lang_pair": ["cs-en", "de-en", "cs-en", "fr-en"], "backward_nll": [1.0, None, 2.0, None],
                  "constraint_set": [[], ["a"], [], []]}, schema=SCHEMA)


def rows(*clauses):
    return ds.dataset(TABLE).to_table(filter=parse_where(list(clauses), SCHEMA)).column("rank").to_pylist()


@pytest.mark.parametrize("clauses,expected", [
    (["rank <= 2"], [1, 2]),
    (["rank<=2", "keep == true"], [1]),                     # clauses are ANDed
    (["rank = 1 or rank = 4"], [1, 4]),                     # SQL '=' and OR
    (["keep and score < 3"], [1, 4]),                       # a bool column alone
    (["NOT (rank > 1) OR lang_pair IN ('fr-en')"], [1, 4]),
    (["lang_pair in ['cs-en', 'de-en'] and not keep"], [2]),
    (["lang_pair not in ('cs-en',)"], [2, 4]),
    (["1 < rank <= 3"], [2, 3]),                            # chained comparison
    (["backward_nll is null"], [2, 4]),
    (["backward_nll is not NULL and score > -1"], [1, 3]),
    (["score >= 1e0"], [2, 3, 4]),
    (["keep == TRUE"], [1, 3, 4]),
])
def test_clauses_select_the_right_rows(clauses, expected):
    assert rows(*clauses) == expected


@pytest.mark.parametrize("clause,message", [
    ("rank<<2", "unsupported expression"),
    ("rank is small", "no column 'small'"),
    ("rnak <= 2", "no column 'rnak'"),
    ("rank <= 'two'", "compares 'rank' (number) with 'two' (string)"),
    ("lang_pair == 3", "compares 'lang_pair' (string) with 3 (number)"),
    ("keep == 1", "compares 'keep' (bool) with 1 (number)"),
    ("rank in (1, 'x')", "compares 'rank' (number) with 'x' (string)"),
    ("rank in score", "list of literals"),
    ("3 in (1, 2)", "list of literals"),
    ("rank == null", "is null"),
    ("__import__('os').system('touch /tmp/x')", "unsupported expression"),
    ("rank.real > 1", "expected a column or a literal"),
    ("constraint_set == 'a'", "cannot be compared"),
    ("rank", "not boolean"),
    ("rank <= (", "cannot"),
    ("1 < 2", "needs a column"),
    ("", "empty"),
])
def test_bad_clauses_fail_with_a_message_before_reading(clause, message):
    with pytest.raises(WhereError, match=__import__("re").escape(message)):
        parse_where([clause], SCHEMA)


def test_no_clause_means_no_filter():
    assert parse_where([], SCHEMA) is None and parse_where(None, SCHEMA) is None
