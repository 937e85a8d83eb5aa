"""Put this folder on PYTHONPATH to run the megatron backend on CPU in a subprocess (``rstar2
train`` / ``rstar2 sft`` under test): right after ``megatron.core`` is first imported in a
process, tests/helpers/megatron_cpu.py's redirections are installed. Processes that never import
megatron-core (engines, sandbox, reward workers, a torch-backend learner) are left alone."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

_REPO = Path(__file__).resolve().parents[3]
_PACKAGE = "megatron.core"


class _InstallAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if str(_REPO) not in sys.path:
                sys.path.append(str(_REPO))
            from tests.helpers.megatron_cpu import install

            install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _InstallAfterImport())
