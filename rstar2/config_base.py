"""What every config section shares: the error type and the strict base model (a leaf module,
so section modules outside :mod:`rstar2.config` can build on it without an import cycle)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from rstar2.errors import UserError


class ConfigError(UserError, ValueError):
    """A user error in a config file or override; ``key`` is the dotted path it concerns."""

    kind: ClassVar[str] = "config error"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:
        return ConfigError, (self.key, self.message)  # crosses processes (Ray actors) whole


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
