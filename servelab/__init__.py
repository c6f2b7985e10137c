"""servelab: measure, explain, predict and choose LLM serving configurations."""

__version__ = "0.1.0"
SCHEMA_VERSION = 2
"""Of the results files (run, summary, sweep, diagnosis, tune, trial, validation). 2: statistics named as `vllm bench
serve` names them; servelab.renames reads version 1."""

_API = (
    "bench",
    "simulate",
    "diagnosis",
    "calibration",
    "calibrate_from",
    "validation",
    "comparison",
    "load_results",
    "Results",
)
"""servelab.api's names. A verb's function is named for what it returns where the verb's name is a package's
(`diagnosis`, not `diagnose`: that is the servelab.diagnose package; so `calibration` and `comparison`)."""


def __getattr__(name: str) -> object:
    """`servelab.simulate(...)` and the rest of servelab.api, imported on first use: `import servelab` stays light
    (every module imports SCHEMA_VERSION from here)."""
    if name in _API:
        from servelab import api

        return getattr(api, name)
    raise AttributeError(f"module 'servelab' has no attribute {name!r}")
