"""The module walk that lowbit.nn's convert functions share."""

from __future__ import annotations

from typing import Callable, Optional

from torch import nn


def replace_modules(model: nn.Module,
                    replacement: Callable[[str, nn.Module], Optional[nn.Module]]) -> nn.Module:
    """Replaces, in place, each submodule of ``model`` for which ``replacement(qualified name,
    module)`` returns a new module, in the order of named_modules(); the children of a module
    that is not replaced are walked in turn. A module used in several places becomes one new
    module used in all of them (``replacement`` sees the name of its first use only). Returns
    ``model``."""
    visited: set[int] = set()
    done: dict[int, nn.Module] = {}

    def swap(parent: nn.Module, prefix: str) -> None:
        # _modules, not named_children(), which leaves out a module's second use
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) in done:
                setattr(parent, child_name, done[id(child)])
                continue
            if id(child) in visited:
                continue
            visited.add(id(child))
            full = f"{prefix}.{child_name}" if prefix else child_name
            new = replacement(full, child)
            if new is not None:
                done[id(child)] = new
                setattr(parent, child_name, new)
            else:
                swap(child, full)

    swap(model, "")
    return model
