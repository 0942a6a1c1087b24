"""Unit numbers past 999,999 (50M pairs at --unit_pairs 40 are 1.25M units): their completion
records are named and read back as the same numbers, so a resume reuses exactly the committed
units, whatever their size."""
import os

from paracorpus.units import finished_units, plan_units, unit_name, unit_of_record, unit_record_path


def test_record_names_of_any_size_read_back_as_their_units():
    for unit in (0, 42, 999_999, 1_000_000, 1_250_000, 12_345_678):
        name = os.path.basename(unit_record_path("w", unit))
        assert name == f"{unit_name(unit)}.json"
        assert unit_of_record(name) == unit
    for other in (".u000042.json.3f9a.tmp", "u42.json", "u00004x.json", "notes.json", "u000042.json.tmp", "u.json",
                  "u１２３４５６.json"):
        assert unit_of_record(other) is None, other


def test_a_resume_past_a_million_units_reuses_exactly_the_committed_ones(tmp_path):
    # the layout of 50M pairs at 40 a unit, then records for units on both sides of 1,000,000
    layout = plan_units({"part-000.tsv": 30_000_000, "part-001.tsv": 20_000_000}, 40)
    total = sum(n for _, n in layout.values())
    assert total == 1_250_000 and layout["part-001.tsv"][0] == 750_000
    committed = {0, 999_999, 1_000_000, 1_000_001, 1_249_999}
    work = str(tmp_path)
    os.makedirs(os.path.join(work, "units"))
    for unit in committed:
        with open(unit_record_path(work, unit), "w") as f:
            f.write("{}")
    with open(os.path.join(work, "units", ".u1000002.json.0f.tmp"), "w") as f:    # staged, not whole
        f.write("{")
    assert finished_units(work) == committed
    remaining = set(range(total)) - finished_units(work)
    assert len(remaining) == total - len(committed) and 1_000_002 in remaining
