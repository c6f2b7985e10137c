"""servelab: measure, explain, predict and choose LLM serving configurations."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
