"""Load a :class:`~rstar2.config.Config` from YAML plus dotted ``key=value`` overrides.

Guarantees: every failure is a :class:`~rstar2.config.ConfigError` naming the full dotted key
(``augmentation.down_sampling_config.down_sample_to_n``), raised before anything heavy starts;
override paths are checked against the schema, so ``no.such.key=1`` is reported as exactly that.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rstar2.config import Config, ConfigError, discriminator_of, section_models
from rstar2.config_rules import check_config

_MAX_SHOWN_INPUT_CHARS = 60


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Return the validated config: defaults, then the YAML file at ``path``, then ``overrides``;
    then the cross-field rules (:func:`rstar2.config_rules.check_config`)."""
    config = _load(path, overrides)
    check_config(config)
    return config


def _load(path: str | Path | None, overrides: Sequence[str]) -> Config:
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    base = _validate(data, source=str(path) if path else "defaults")
    if not overrides:
        return base
    merged = base.model_dump(mode="json")
    for item in overrides:
        key, raw = _split_override(item)
        leaf_type = _field_type(Config, key.split("."))
        value = _parse_value(raw, leaf_type)
        _assign(merged, key, value)
        _reshape_if_switched(merged, key, value)
    return _validate(merged, source="overrides")


def write_resolved_config(config: Config, run_dir: Path) -> Path:
    """Write ``config.json`` (the fully resolved tree) into ``run_dir`` and return its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "config.json"
    out.write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError("", f"config file not found: {path}")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError("", f"{path}{where}: not valid YAML") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("", f"{path}: the top level must be a mapping of keys")
    return loaded


def _validate(data: dict[str, Any], *, source: str) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise _to_config_error(exc, source) from None


def _to_config_error(exc: ValidationError, source: str) -> ConfigError:
    err = exc.errors()[0]
    parts, models = _schema_path(err["loc"])
    key = ".".join(parts)
    if err["type"] == "union_tag_invalid":
        choices = ", ".join(repr(tag) for tag in models)
        got = err.get("ctx", {}).get("tag")
        tag_key = f"{key}.{discriminator_of(models) or ''}"
        return ConfigError(tag_key, f"must be one of {choices} (got {got!r})")
    if err["type"] == "extra_forbidden":
        return ConfigError(key, _unknown_key_message(parts, source))
    if err["type"] == "missing":
        _, parent = _schema_path(parts[:-1])
        chooser = discriminator_of(parent)
        tag = next((t for t in err["loc"] if t in parent), None) if chooser else None
        shape = f" when {'.'.join([*parts[:-1], chooser or ''])} is {tag!r}" if tag else ""
        return ConfigError(key, f"required{shape} (in {source})")
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] != "value_error" and "input" in err:
        shown = repr(err["input"])
        if len(shown) > _MAX_SHOWN_INPUT_CHARS:
            shown = shown[:_MAX_SHOWN_INPUT_CHARS] + "..."
        message += f" (got {shown})"
    return ConfigError(key, message)


def _schema_path(loc: Sequence[Any]) -> tuple[list[str], dict[str, type[BaseModel]]]:
    """A pydantic error location (or dotted key parts) as config keys, the tags of tagged
    sections dropped, and the section models found at its end ({} at a leaf)."""
    parts: list[str] = []
    models: dict[str, type[BaseModel]] = {"": Config}
    for item in loc:
        if len(models) > 1 and item in models:
            models = {item: models[item]}
            continue
        parts.append(str(item))
        if isinstance(item, int) or str(item).isdigit():
            continue  # a list index: the element's models were set by the list's field
        fields = {n: f for m in models.values() for n, f in m.model_fields.items()}
        if item not in fields:
            models = {}
            continue
        annotation = fields[item].annotation
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        models = section_models(annotation)
    return parts, models


def _unknown_key_message(parts: list[str], source: str) -> str:
    """'unknown config key', or which shape of a tagged section takes that key."""
    _, models = _schema_path(parts[:-1])
    field = discriminator_of(models)
    owners = [tag for tag, m in models.items() if parts[-1] in m.model_fields]
    if field and owners:
        section = ".".join([*parts[:-1], field])
        return f"only {section} {' or '.join(map(repr, owners))} has this key (in {source})"
    return f"unknown config key (in {source})"


def _split_override(item: str) -> tuple[str, str]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(item, "an override must look like dotted.key=value")
    return key, raw


def _unwrap_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _field_type(model: type[BaseModel], parts: list[str]) -> Any:
    """Type annotation at the dotted path ``parts`` of ``model``; ConfigError if absent. In a
    tagged section a key of any of its shapes is accepted here (validation checks the shape)."""
    tp: Any = model
    for depth, part in enumerate(parts):
        here = ".".join(parts[: depth + 1])
        models = section_models(tp)
        if models:
            fields = {n: f for m in models.values() for n, f in m.model_fields.items()}
            if part not in fields:
                hint = difflib.get_close_matches(part, list(fields), n=1)
                extra = f"; did you mean '{'.'.join([*parts[:depth], hint[0]])}'?" if hint else ""
                raise ConfigError(".".join(parts), f"unknown config key{extra}")
            tp = fields[part].annotation
        elif typing.get_origin(tp) is list:
            if not part.isdigit():
                raise ConfigError(here, "a list element is addressed by its index")
            tp = typing.get_args(tp)[0]
        else:
            raise ConfigError(".".join(parts), f"unknown config key ('{here}' has no sub-keys)")
    return tp


def _reshape_if_switched(data: dict[str, Any], key: str, value: Any) -> None:
    """After ``learner.backend=megatron`` (a tagged section's shape changed by an override),
    drop the section's keys the new shape does not have; the shared ones are kept."""
    parts = key.split(".")
    _, models = _schema_path(parts[:-1])
    if discriminator_of(models) != parts[-1] or value not in models:
        return
    node: Any = data
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    keep = models[value].model_fields
    for name in [n for n in node if n not in keep]:
        del node[name]


def _parse_value(raw: str, leaf_type: Any) -> Any:
    """Turn an override's text into a value; strings stay verbatim for str-typed fields."""
    stripped = raw.strip()
    base = _unwrap_optional(leaf_type)
    if base is not leaf_type and stripped.lower() in ("null", "none", "~"):
        return None
    if base is str:
        return raw
    try:
        return yaml.safe_load(stripped) if stripped else ""
    except yaml.YAMLError:
        return raw


def _assign(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            nxt = node[int(part)] if int(part) < len(node) else None
        else:
            nxt = node.get(part)
        if nxt is None:
            where = ".".join(parts[: depth + 1])
            raise ConfigError(key, f"'{where}' is unset or out of range; set the whole section")
        node = nxt
    last = parts[-1]
    if isinstance(node, list):
        index = int(last)
        if index >= len(node):
            raise ConfigError(key, f"index out of range (the list has {len(node)} entries)")
        node[index] = value
    else:
        node[last] = value
