"""The rules a run keeps its SLURM worker jobs by (beam_pipelines/slurm_fleet.py), tried on
made-up squeue rows; tests/test_slurm.py tries them on a real SLURM."""
from beam_pipelines.slurm_fleet import Fleet, Row


def _fleet(target=2, **kw):
    fleet = Fleet(target, check_s=10, **kw)
    for i in range(target):
        fleet.submitted(f"w-{i}", str(100 + i), 0.0)
    return fleet


def test_a_lost_worker_that_had_joined_is_replaced_at_once():
    fleet = _fleet()
    fleet.joined("w-0"), fleet.joined("w-1")
    step = fleet.look({"100": Row("R", "None", "n1")}, 10.0)        # 101 gone from the queue
    assert [j.job_id for j in step.ended] == ["101"] and step.ended[0].joined
    assert step.want == 2 and not step.give_up and not step.exclude


def test_failed_starts_back_off_then_give_up_naming_the_jobs():
    fleet = Fleet(1, check_s=10)
    now, ids = 0.0, []
    for attempt in range(5):
        job_id = str(200 + attempt)
        fleet.submitted(f"s-{attempt}", job_id, now)
        ids.append(job_id)
        now += 20
        step = fleet.look({job_id: Row("F", "NonZeroExitCode", f"n{attempt}")}, now)
        if attempt < 4:
            assert not step.give_up and step.want == 0              # backing off: nothing submitted now
            wait = 30 * 2 ** attempt
            assert fleet.backoff_until() == now + wait
            assert fleet.look({}, now + wait - 1).want == 0 and fleet.look({}, now + wait).want == 1
    assert step.give_up.startswith("5 SLURM worker jobs in a row ended before any of their workers joined")
    assert all(i in step.give_up for i in ids)


def test_a_start_that_joins_resets_the_back_off():
    fleet = _fleet(target=1)
    fleet.look({}, 5.0)                                            # 100 failed to start
    assert fleet.backoff_until() == 35.0
    fleet.submitted("w-9", "300", 40.0)
    fleet.joined("w-9")
    assert fleet.backoff_until() == 0.0 and fleet.look({"300": Row("R", "", "n2")}, 41.0).want == 1


def test_a_node_that_fails_two_starts_is_excluded_once():
    fleet = _fleet(target=1)
    assert fleet.look({"100": Row("F", "", "n1")}, 10.0).exclude == []
    fleet.submitted("w-1", "101", 50.0)
    assert fleet.look({"101": Row("CD", "", "n1")}, 60.0).exclude == ["n1"]
    fleet.submitted("w-2", "102", 200.0)
    assert fleet.look({"102": Row("F", "", "n1")}, 210.0).exclude == []
    assert fleet.excluded == ["n1"]


def test_long_pending_jobs_are_reported_with_slurms_reason_now_and_then():
    fleet = _fleet()
    rows = {"100": Row("PD", "QOSMaxGRESPerUser"), "101": Row("PD", "PartitionDown")}
    assert fleet.look(rows, 0.0).report is None
    assert fleet.look(rows, 99.0).report is None                   # 10 looks (100 s) before a report
    said = fleet.look(rows, 100.0).report
    assert "2 worker job(s) pending" in said and "GPUs per user" in said and "partition is down" in said
    assert fleet.look(rows, 150.0).report is None and fleet.look(rows, 200.0).report


def test_a_spare_is_submitted_before_a_worker_reaches_its_lifetime():
    # lifetime 10 min +- 1 min: the earliest end 540 s after the start; spare 108 s before it
    fleet = _fleet(target=2, lifetime_s=600, stagger_s=60)
    running = {"100": Row("R", "", "n1"), "101": Row("R", "", "n2")}
    assert fleet.look(running, 0.0).want == 2
    assert fleet.look(running, 431.0).want == 2
    step = fleet.look(running, 433.0)
    assert step.want == 4                                          # one spare for each
    fleet.submitted("w-2", "102", 433.0), fleet.submitted("w-3", "103", 433.0)
    both = {**running, "102": Row("PD", "Priority"), "103": Row("PD", "Priority")}
    assert fleet.look(both, 440.0).want == 4
    # the old ones leave: two left, none near its end, nothing more submitted
    step = fleet.look({"102": Row("R", "", "n3"), "103": Row("R", "", "n1")}, 600.0)
    assert [j.job_id for j in step.ended] == ["100", "101"] and step.want == 2


def test_spares_go_in_earlier_when_jobs_wait_long_in_the_queue():
    fleet = Fleet(1, lifetime_s=600, stagger_s=60, check_s=10)
    assert fleet.spare_at_s() == 540 - 108
    fleet.submitted("w-0", "100", 0.0)
    fleet.look({"100": Row("PD", "Priority")}, 0.0)
    fleet.look({"100": Row("R", "", "n1")}, 200.0)                 # it waited 200 s
    assert fleet.spare_at_s() == 540 - (1.5 * 200 + 10)
    assert fleet.look({"100": Row("R", "", "n1")}, 200.0 + 229).want == 1
    assert fleet.look({"100": Row("R", "", "n1")}, 200.0 + 230).want == 2


def test_the_fleet_keeps_target_jobs_that_are_not_near_their_end():
    fleet = Fleet(1, lifetime_s=180, stagger_s=60, check_s=2)      # short lives: a spare 96 s after a start
    fleet.submitted("w-0", "100", 0.0)
    fleet.joined("w-0")
    assert fleet.look({"100": Row("R", "", "n1")}, 0.0).want == 1
    assert fleet.look({"100": Row("R", "", "n1")}, 97.0).want == 2
    fleet.submitted("w-1", "101", 97.0)
    fleet.joined("w-1")
    rows = {"100": Row("R", "", "n1"), "101": Row("R", "", "n2")}
    assert fleet.look(rows, 98.0).want == 2
    assert fleet.look(rows, 194.0).want == 3                    # the spare near its own end: its own spare
    assert fleet.look({"101": Row("R", "", "n2")}, 200.0).want == 2     # 100 left
