"""The question a diagnosis answers first (`diagnose --goal`), kept apart from the levers that answer it so the
command line's help names the choices without importing the simulator."""

from __future__ import annotations

from enum import StrEnum


class Goal(StrEnum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"
