"""``kale status`` shows how the last rescale came back (warm or restart) and its pauses."""

from kale_airflow.cli.ops import _last_rescale, _rescale_lines
from kale_airflow.runtime.elastic import PAUSES_KEY, WARM, merge_pause, pause_record
from kale_airflow.store import StateStore


def test_status_names_the_kind_and_pauses_of_the_last_rescale(tmp_path):
    store = StateStore(f"sqlite:///{tmp_path / 'kale.db'}")
    assert _last_rescale(store, None) is None and _rescale_lines(None) == []
    store.set_value("rescale/g2", pause_record("g2", WARM, 100.0, 101.0, 101.9, 2, 4, 0))
    store.set_value(PAUSES_KEY, merge_pause({"generation": "g1", "pauses": [30.0]}, "g2", 1.9, WARM))
    store.set_value("restart/g2", pause_record("g2", "restart", None, 105.0, 117.0, 4, 4, 0, "restart after slot 1 "
                                               "ended with signal SIGKILL"))
    lines = _rescale_lines(_last_rescale(store, "g2"))
    assert lines[0] == "last rescale: 2 -> 4 rank(s), warm: first step 1.9 s after the decision, 0.9 s after the last step"
    assert "restarted from the checkpoint within the generation (restart after slot 1" in lines[1] and "12.0 s" in lines[1]
    assert lines[2] == "recent rescale pauses: 30 s ?, 1.9 s warm"
