"""structlog configuration, done once at the entry point.

Everything (ours and libraries' stdlib records) goes through stdlib logging
with ``ProcessorFormatter``: a readable console on a TTY, JSON lines
otherwise or into a file. Context such as project, issue and tick is bound
with contextvars. A redaction processor blanks values under secret-looking
keys; secrets are never formatted into messages in the first place.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.core.environment import is_secret_name


def redact_secrets(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Blank the value of any field whose name says it may hold a secret (the same
    rule as for environment variables: ``core.environment.is_secret_name``)."""
    for key in list(event):
        if is_secret_name(key):
            event[key] = "[redacted]"
    return event


_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    redact_secrets,
]


_JSON: list[Any] = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
"""JSON lines with the traceback of any logged exception as text (``exception`` key)."""


def configure(level: str = "WARNING", *, json_file: Path | None = None) -> None:
    """Route structlog and stdlib logging to stderr (and optionally a JSON file)."""
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # not cached: a logger a module made before this call (or before a test's
        # capture_logs) follows the configuration in force, whatever ran first
        cache_logger_on_first_use=False,
    )
    tty = sys.stderr.isatty()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *([structlog.dev.ConsoleRenderer(colors=tty)] if tty else _JSON),
            ],
        )
    )
    handlers: list[logging.Handler] = [console]
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(json_file, encoding="utf-8")
        file_handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=_SHARED,
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_JSON],
            )
        )
        handlers.append(file_handler)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level.upper())
