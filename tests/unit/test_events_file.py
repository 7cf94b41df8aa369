"""events.json is written as every file of a run: its temporary name carries the run's id."""

import json

from mpi4py import MPI

from minidp.comm import Topology
from minidp.strategies.events import SERVER_COLUMNS, EventLog, write_events


def test_a_killed_jobs_temporary_events_file_is_the_runs_own_and_replaced(tmp_path):
    # A job killed while it wrote events.json leaves events.json.tmp-RUNID; the run's next
    # write (a resumed job of the same run) recognises the name as its own.
    leftover = tmp_path / "events.json.tmp-run-7"
    leftover.write_text('{"half')
    log = EventLog(SERVER_COLUMNS)
    log.add(0, 1, 2, 8)
    write_events(str(tmp_path / "events.json"), "asgd", Topology(MPI.COMM_WORLD), log,
                 tag="run-7")
    assert not leftover.exists()
    record = json.loads((tmp_path / "events.json").read_text())
    assert record["strategy"] == "asgd"
    assert record["ranks"][0]["rows"] == [[0, 1, 2, 8]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.json"]
