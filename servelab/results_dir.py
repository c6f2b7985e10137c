"""The rule for a results directory a verb is about to write: new, empty, or (asked) an earlier servelab result.

Shared by the CLI's --result-dir/--overwrite and the Python API's `result_dir=`/`overwrite=`, so neither face
overwrites a run without being asked. It sits with the verbs: it names the documents of tune and report too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from servelab.errors import InputError
from servelab.metrics.results import RECORDS, RUN, SUMMARY, SWEEP, TIMELINE


def result_markers() -> dict[str, str]:
    """The files that say a directory holds a servelab result, and what they say it holds (imported here: the
    tune and report modules are heavy, and only a given --result-dir needs them)."""
    from servelab.report.inputs import COMPARE
    from servelab.tune.outcome import TUNE_JSON
    from servelab.tune.study import STUDY_DB

    return {RUN: "run", SWEEP: "sweep", TUNE_JSON: "tune study", STUDY_DB: "tune study", COMPARE: "comparison"}


RESULT_FILES = {RECORDS, TIMELINE, SUMMARY, "report.html", "diagnosis.json", "compare.html", "live-server.json"}
"""The other files a result directory holds (its subdirectories are sweep points, trials and servers' runs)."""


def result_dir_refusal(directory: Path, overwrite: bool) -> None:
    """InputError unless `directory` may receive a new result: new, empty, or (with --overwrite) holding a servelab
    result. A directory of other files is never cleared: --overwrite replaces results, not whatever is there."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise InputError(f"--result-dir {directory} is a file, not a directory")
    names = sorted(p.name for p in directory.iterdir())
    if not names:
        return
    markers = result_markers()
    held = [markers[n] for n in names if n in markers]
    if not held:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise InputError(
            f"--result-dir {directory} holds files that are not a servelab result ({shown}); "
            "choose a new or empty directory"
        )
    if not overwrite:
        raise InputError(
            f"--result-dir {directory} already holds a {held[0]}; pass --overwrite to replace it "
            "(the directory is emptied first), or choose another directory"
        )
    foreign = [
        n
        for n in names
        if (directory / n).is_file() and n not in markers and n not in RESULT_FILES and not n.endswith(".tmp")
    ]
    if foreign:
        raise InputError(
            f"--result-dir {directory} holds a {held[0]} and files that are not servelab's "
            f"({', '.join(foreign[:3])}): --overwrite would delete them; move them away first"
        )
    if Path.cwd().resolve().is_relative_to(directory.resolve()):
        raise InputError(
            f"--result-dir {directory} --overwrite would empty the directory you are working in; "
            "name the results directory itself"
        )


def clear_result_dir(directory: Path) -> None:
    """Empty an earlier result out of `directory` (call once every input is checked, `result_dir_refusal` first)."""
    if directory.is_dir() and any(directory.iterdir()):
        shutil.rmtree(directory)
