"""Typed messages of sandbox_pool, and the frame codec used between processes (pure).

``ExecRequest`` / ``ExecResult`` are the native API's shapes (``POST /v1/execute``). Frames are
a 4-byte big-endian length followed by UTF-8 JSON; a frame larger than ``MAX_FRAME_BYTES`` is a
protocol error, never an allocation.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "rejected", "internal_error"]
STATUSES: tuple[Status, ...] = (
    "ok",
    "error",
    "timeout",
    "memory",
    "output_limit",
    "rejected",
    "internal_error",
)
Language = Literal["python", "cpp"]
Mode = Literal["cell", "script"]
MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")


def timeout_message(timeout_s: float) -> str:
    """The line the pool appends to stderr when it kills a call at its deadline."""
    return f"TimeoutError: execution exceeded {timeout_s:g} s"


TIMEOUT_PREFIX = "TimeoutError: execution exceeded "


class ProtocolError(ValueError):
    """A malformed request or frame; the message is safe to show to the client."""


class BodyError(ProtocolError):
    """A request body that is not strict JSON: ``error`` says why (the JSON decoder's words
    where it found it), ``pos`` the character where (0 when not one place)."""

    def __init__(self, error: str, pos: int = 0) -> None:
        super().__init__(f"body is not valid JSON ({error})")
        self.error = error
        self.pos = pos


def decode_body(raw: bytes) -> Any:
    """The JSON value of a request body, held to strict JSON: UTF-8 text, no ``NaN`` or
    ``Infinity``, no lone UTF-16 surrogate escape (it could not be written out as code or
    stdin), integers of at most Python's 4,300 digits, nesting within the decoder's recursion
    limit. Anything else is a :class:`BodyError` with a one-line reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"not UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BodyError(f"{exc.msg} at character {exc.pos}", exc.pos) from None
    except RecursionError:
        raise BodyError("nested too deeply") from None
    except ValueError as exc:  # an integer past the digit limit; NaN or Infinity
        raise BodyError(str(exc)) from None
    _refuse_lone_surrogates(value)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _refuse_lone_surrogates(value: Any) -> None:
    """BodyError if a string (key or value) anywhere in ``value`` holds a lone surrogate;
    iterative, so a value as deep as the decoder allows is no problem."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BodyError(f"lone surrogate \\u{ord(item[exc.start]):04x}") from None


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-call resource limits (the server's caps bound what a request may ask for)."""

    timeout_s: float = 4.0
    memory_mb: int = 1024
    max_output_chars: int = 65536  # per stream returned; a request may ask for more, up to
    # max_file_mb (the size a stream can reach)
    max_processes: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64


@dataclass(frozen=True, kw_only=True)
class ExecRequest:
    """One call. ``mode`` ``cell`` (default) prints a final bare expression and reports errors
    as ``<ErrType> at line N``; ``script`` runs the code exactly as ``python3 main.py`` would
    (see :mod:`sandbox_pool.runner`). ``max_output_chars`` lowers the pool's cap per stream."""

    code: str
    stdin: str = ""
    timeout_s: float | None = None
    memory_mb: int | None = None
    language: Language = "python"
    mode: Mode = "cell"
    max_output_chars: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, *, max_code_chars: int = 1_000_000) -> ExecRequest:
        """Validate a decoded JSON body; ProtocolError names the offending field."""
        if not isinstance(data, dict):
            raise ProtocolError("request body must be a JSON object")
        unknown = set(data) - _REQUEST_FIELDS
        if unknown:
            raise ProtocolError(f"unknown field(s): {', '.join(sorted(unknown))}")
        code = data.get("code")
        if not isinstance(code, str):
            raise ProtocolError("'code' must be a string")
        if len(code) > max_code_chars:
            raise ProtocolError(f"'code' exceeds {max_code_chars} characters")
        stdin = data.get("stdin") or ""
        if not isinstance(stdin, str):
            raise ProtocolError("'stdin' must be a string")
        if len(stdin) > max_code_chars:
            raise ProtocolError(f"'stdin' exceeds {max_code_chars} characters")
        language = data.get("language", "python")
        if language not in ("python", "cpp"):
            raise ProtocolError("'language' must be 'python' or 'cpp'")
        mode = data.get("mode", "cell")
        if mode not in ("cell", "script"):
            raise ProtocolError("'mode' must be 'cell' or 'script'")
        return cls(
            code=code,
            stdin=stdin,
            timeout_s=_optional_number(data, "timeout_s", float),
            memory_mb=_optional_number(data, "memory_mb", int),
            language=language,
            mode=mode,
            max_output_chars=_optional_number(data, "max_output_chars", int),
        )


_REQUEST_FIELDS = frozenset(
    {"code", "stdin", "timeout_s", "memory_mb", "language", "mode", "max_output_chars"}
)


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecResult:
        status = data.get("status")
        if status not in STATUSES:
            raise ProtocolError(f"unknown status {status!r}")
        return cls(
            status=status,
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            exit_code=data.get("exit_code"),
            duration_s=float(data.get("duration_s", 0.0)),
        )


def _optional_number(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
        or value <= 0
    ):
        raise ProtocolError(f"'{key}' must be a positive finite number")
    return kind(value)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (a blocking pipe, file or memfd)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def encode_frame(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Incremental decoder: feed bytes, take complete decoded frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        frames = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > MAX_FRAME_BYTES:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit")
            if len(self._buf) < _HEADER.size + size:
                break
            body = bytes(self._buf[_HEADER.size : _HEADER.size + size])
            del self._buf[: _HEADER.size + size]
            frames.append(json.loads(body))
        return frames
