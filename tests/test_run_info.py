"""run.json is a RunInfo: built by its producer, extended by the run, written as its dump, byte for byte as before.

Every producer sets its keys in its own order (bench: verb, source, argv, flags, the server's cache config; tune's
stage 2: kind, source, label, ...), the run then adds its workload, server, end and host; the file has always kept
that order and whole counts as integers. The stored bench run (a real vLLM run's run.json) and the stored documents
read back and dumped again must give the same text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab import SCHEMA_VERSION
from servelab.metrics.results import RUN, ResultsDirError, ResultWriter, load_run
from servelab.renames import upgraded
from servelab.schemas.results import RunInfo

STORED = [
    Path(__file__).parent / "fixtures" / "results" / "servelab-closed-c4" / RUN,
]


def _text(data: object) -> str:
    return json.dumps(data, indent=2, default=str)


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.parent.name)
def test_a_stored_run_json_reads_back_to_the_same_text(path: Path) -> None:
    given = json.loads(path.read_text())
    assert _text(RunInfo.model_validate(given).model_dump(exclude_unset=True)) == _text(given)


def test_the_writer_keeps_the_producers_order_and_adds_the_runs_keys_after(tmp_path: Path) -> None:
    info = RunInfo.begun(kind="tune-stage2", source="http", label="a", argv=["x"], base_url="http://h:1")
    writer = ResultWriter(tmp_path, info.with_keys(workload={"arrival": {"request_rate": 4, "burstiness": 1}}))
    writer.update_run_info(server_info={"base_url": "http://h:1", "engine": None}, interrupted=False, finished_at=2.0)
    writer.close()
    written = json.loads((tmp_path / RUN).read_text())
    assert list(written) == [
        "schema_version",
        "started_at",
        "versions",
        "kind",
        "source",
        "label",
        "argv",
        "base_url",
        "workload",
        "server_info",
        "interrupted",
        "finished_at",
    ]
    assert list(written["server_info"]) == ["base_url", "engine"]
    assert written["workload"]["arrival"] == {"request_rate": 4, "burstiness": 1}
    assert isinstance(written["workload"]["arrival"]["request_rate"], int)
    assert written["started_at"] >= info.started_at


def test_a_key_of_the_wrong_type_is_refused_when_set() -> None:
    with pytest.raises(ValueError, match="finished_at"):
        RunInfo.begun(verb="bench").with_keys(finished_at="soon")


def test_the_flags_read_back_by_name_are_fields_typed_as_written_and_the_rest_kept_as_given() -> None:
    flags = {"gpu": "a100-80gb", "tp": 2, "request_rate": 4, "max_concurrency": None, "engine": "vllm", "seed": 3}
    info = RunInfo.begun(verb="simulate", flags=flags)
    assert (info.flags.gpu, info.flags.tp, info.flags.request_rate) == ("a100-80gb", 2, 4)
    assert info.flags.engine == "vllm" and info.flags.model_extra == {"seed": 3}  # a verb's other flags stay open
    assert info.model_dump(exclude_unset=True)["flags"] == flags  # a whole rate stays a whole number
    with pytest.raises(ValueError, match=r"flags\.tp"):
        info.with_keys(flags={**flags, "tp": "two"})


DATA = Path(__file__).parent / "data"
LOADED = [
    *STORED,
    *sorted((DATA / "results-schema-1").rglob(RUN)),
    *sorted((DATA / "results-before-schemas").rglob(RUN)),
]
"""Every run.json the repository keeps as a real run's (tests/data/documents' are masked: `<volatile>` times)."""


@pytest.mark.parametrize("path", LOADED, ids=lambda p: str(p.parent.relative_to(p.parents[2])))
def test_load_run_reads_every_stored_run_json_as_a_run_info_with_its_keys_unchanged(path: Path) -> None:
    """load_run types run.json (an older schema's statistics renamed first); its dump is the file's keys and values."""
    run = load_run(path.parent)
    assert isinstance(run.run_info, RunInfo) and run.run_info.started_at > 0
    assert run.run_info.model_dump(mode="json", exclude_unset=True) == upgraded(
        json.loads(path.read_text()), SCHEMA_VERSION
    )


def test_a_run_json_run_info_refuses_is_an_error_naming_the_file_and_the_field(tmp_path: Path) -> None:
    info = RunInfo.begun(verb="bench", workload={"arrival": {"max_concurrency": 4}})
    ResultWriter(tmp_path, info).close()
    given = json.loads((tmp_path / RUN).read_text())
    given["workload"]["arrival"]["max_concurrency"] = "four"
    (tmp_path / RUN).write_text(json.dumps(given))
    with pytest.raises(ResultsDirError, match=rf"{tmp_path / RUN} is not one .*: workload\.arrival\.max_concurrency"):
        load_run(tmp_path)
