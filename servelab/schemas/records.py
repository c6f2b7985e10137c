"""`RequestRecord`: what happened to one request, whatever served it; one line of records.jsonl.

Times are seconds on one monotonic clock whose zero is the start of the run;
`run.json` stores the wall-clock time of that zero. It stays a slotted
dataclass (every target builds and mutates one per request, the simulator
thousands a second); its JSON Schema (`servelab schema record`) is derived
from it by pydantic, the attribute docstrings being the descriptions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import ConfigDict, TypeAdapter

from servelab.schemas.vocabulary import RequestStatus


@dataclass(slots=True)
class RequestRecord:
    """One line of records.jsonl: one request, whatever served it. Times are seconds from the run's start."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, title="RecordRow")

    index: int
    intended_time: float
    """When the schedule wanted it sent; send_time - intended_time is client lag."""
    send_time: float
    finish_time: float
    first_token_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    """Arrival of every streamed chunk with output."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: str = RequestStatus.OK
    """ok or error."""
    error_kind: str | None = None
    """http_500, connection_reset, connection_refused, timeout, ..."""
    error: str | None = None
    prefix_group: int | None = None
    priority: int = 0
    tokens_estimated: bool = False
    """No usage in the stream: token counts are the client's estimate."""
    # prompt_tokens is then the plan's prompt length and output_tokens the number of chunks with output (a chunk may
    # hold several tokens), not the server's own counts.
    schedule_time: float | None = None
    """When the engine first scheduled it (simulator only)."""
    preemptions: int = 0
    connection_reused: bool | None = None
    """HTTP: sent on a kept-alive connection (null: not HTTP, or no response)."""
    http_connect_s: float | None = None
    """HTTP: handshake of the new connection it needed (null when reused)."""
    http_send_s: float | None = None
    """HTTP: from send_time (after any connect) to its bytes handed to the kernel."""
    http_wait_s: float | None = None
    """HTTP: from sent to the response's first byte."""
    # Network both ways, the API server and, for a server that sends its headers with the first token, queueing
    # and prefill.
    http_receive_s: float | None = None
    """HTTP: from the first byte to the last."""
    base_url: str | None = None
    """The replica that served it, when the load was spread over several --base-url."""
    abandoned: bool = False
    """The client gave up on it mid-way (--abandon-after); status abandoned, not an error."""

    @property
    def ok(self) -> bool:
        return self.status == RequestStatus.OK

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.send_time

    @property
    def e2el(self) -> float:
        return self.finish_time - self.send_time

    def to_json(self) -> str:
        """The record's line of records.jsonl (without its newline), in json.dumps's spelling of numbers."""
        return json.dumps({name: getattr(self, name) for name in _FIELDS}, separators=(",", ":"))


_FIELDS = tuple(RequestRecord.__dataclass_fields__)

RECORD = TypeAdapter(RequestRecord)
"""records.jsonl's line type: reads a line (`RECORD.validate_json`) and gives its JSON Schema."""
