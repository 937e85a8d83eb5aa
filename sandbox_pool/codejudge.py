"""code-judge compatibility: request models, settings from its environment variables, and the
mapping from a sandbox result to code-judge's ``SubmissionResult`` (pure: no I/O).

Matches code-judge at the commit rStar2-Agent pins (``f809f35``):
- ``/run``, ``/judge`` and their ``/batch`` and ``/long-batch`` forms take the same bodies;
  a body that does not validate is a 422 with FastAPI's ``{"detail": [...]}`` shape.
- ``type`` is required (``python``, ``cpp`` or ``math``); ``math`` is answered
  ``internal_error``, as code-judge has no executor for it.
- A Python submission runs as a plain script (no expression echo); a C++ one is compiled with
  g++ ``-O2`` and run. ``run_success`` is exit code 0; ``success`` also needs
  ``stdout.strip() == expected_output.strip()`` when an expected output is given, compared on
  the whole output before stdout and stderr are each cut to ``MAX_STDOUT_ERROR_LENGTH``.
- A timeout is ``reason: worker_timeout`` with what was printed, then ``Suicide from timeout.``
  on stdout (code-judge's own marker); a submission that could not start within its queue
  deadline is ``reason: queue_timeout`` (clients retry those).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from sandbox_pool.protocol import (
    TIMEOUT_PREFIX,
    BodyError,
    ExecRequest,
    ExecResult,
    decode_body,
)

TIMEOUT_MARK = "Suicide from timeout."
# Room kept past a long expected output, so that the comparison sees the whole stdout.
_COMPARE_SLACK_CHARS = 65536


class Submission(BaseModel):
    sub_id: str | None = None
    type: Literal["python", "cpp", "math"]
    options: dict[str, str] | None = None
    solution: str
    input: str | None = None
    expected_output: str | None = None


class BatchSubmission(BaseModel):
    sub_id: str | None = None
    type: Literal["batch"] = "batch"
    submissions: list[Submission] = Field(..., min_length=1)


class InvalidBody(ValueError):
    """A body code-judge would answer 422; ``detail`` is FastAPI's list of errors."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail[0].get("msg", "invalid body") if detail else "invalid body")
        self.detail = detail


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """Validate a request body as FastAPI does for ``model``; InvalidBody otherwise."""
    try:
        data = decode_body(raw)
    except BodyError as exc:
        raise InvalidBody(
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", exc.pos],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.error},
                }
            ]
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False))
        for err in errors:
            err["loc"] = ["body", *err.get("loc", [])]
        raise InvalidBody(errors) from None


@dataclass(frozen=True, kw_only=True)
class CodeJudgeSettings:
    """code-judge's environment variables that change what a client sees (units in names)."""

    max_stdout_error_chars: int = 1000  # MAX_STDOUT_ERROR_LENGTH
    queue_wait_s: float = 4.0  # MAX_QUEUE_WORK_LIFE_TIME: /run, /batch wait for a free worker
    long_batch_wait_s: float = 3600.0 + 15.0  # LONG_BATCH_MAX_QUEUE_WAIT_TIME

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CodeJudgeSettings:
        """Settings from code-judge's variables where set; ValueError names a bad one."""
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            max_stdout_error_chars=int(
                env_number(env, "MAX_STDOUT_ERROR_LENGTH", defaults.max_stdout_error_chars)
            ),
            queue_wait_s=env_number(env, "MAX_QUEUE_WORK_LIFE_TIME", defaults.queue_wait_s),
            long_batch_wait_s=env_number(
                env, "LONG_BATCH_MAX_QUEUE_WAIT_TIME", defaults.long_batch_wait_s
            ),
        )


def env_number(env: Mapping[str, str], name: str, default: float) -> float:
    """``env[name]`` as a positive number, ``default`` when unset; ValueError when malformed."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


def to_request(sub: Submission, settings: CodeJudgeSettings) -> ExecRequest:
    """The sandbox call for a python or cpp submission (``math`` has no executor)."""
    cap = settings.max_stdout_error_chars
    if sub.expected_output is not None:
        cap = max(cap, 2 * len(sub.expected_output) + _COMPARE_SLACK_CHARS)
    language: Literal["python", "cpp"] = "cpp" if sub.type == "cpp" else "python"
    return ExecRequest(
        code=sub.solution,
        stdin=sub.input or "",
        language=language,
        mode="script",
        max_output_chars=cap,
    )


def sub_id_of(sub: Submission | BatchSubmission) -> str:
    return sub.sub_id or str(uuid.uuid4())


def submission_result(
    sub: Submission, sub_id: str, result: ExecResult, settings: CodeJudgeSettings
) -> dict[str, Any]:
    """code-judge's SubmissionResult for a submission that ran."""
    stdout, stderr = result.stdout, result.stderr
    run_success = result.exit_code == 0 and result.status in ("ok", "output_limit")
    success = run_success
    if sub.expected_output is not None:
        whole = result.status != "output_limit"
        success = success and whole and stdout.strip() == sub.expected_output.strip()
    reason = ""
    if result.status == "timeout":
        reason = "worker_timeout"
        stderr = _drop_timeout_line(stderr)
        stdout = (stdout if not stdout or stdout.endswith("\n") else stdout + "\n") + TIMEOUT_MARK
        stdout += "\n"
    elif result.status == "internal_error":
        reason = "internal_error"
    cut = settings.max_stdout_error_chars
    return {
        "sub_id": sub_id,
        "success": success,
        "run_success": run_success,
        "cost": result.duration_s,
        "stdout": stdout[:cut],
        "stderr": stderr[:cut],
        "reason": reason,
    }


def failed_result(sub_id: str, reason: str, cost_s: float) -> dict[str, Any]:
    """A SubmissionResult for one that did not run (``queue_timeout``, ``internal_error``)."""
    return {
        "sub_id": sub_id,
        "success": False,
        "run_success": False,
        "cost": cost_s,
        "stdout": None,
        "stderr": None,
        "reason": reason,
    }


JUDGE_FIELDS = ("sub_id", "success", "run_success", "cost", "reason")


def judge_view(result: dict[str, Any]) -> dict[str, Any]:
    """``/judge`` endpoints answer without stdout and stderr."""
    return {k: result[k] for k in JUDGE_FIELDS}


def _drop_timeout_line(stderr: str) -> str:
    head, sep, last = stderr.rstrip("\n").rpartition("\n")
    if last.startswith(TIMEOUT_PREFIX):
        return head + sep if head else ""
    return stderr
