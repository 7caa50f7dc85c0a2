"""A traitlets option naming a GPU backend, checked against the registry when it is set."""

from __future__ import annotations

from typing import Any

from traitlets import Unicode

from .vendors import backend_names


class BackendName(Unicode):
    """``auto`` or the name of a registered backend (:mod:`krex_lab.gpu.vendors`)."""

    info_text = "'auto' or a registered GPU backend's name"

    @property
    def values(self) -> list[str]:
        """The names it accepts (command lines show them as choices)."""
        return backend_names()

    def validate(self, obj: Any, value: Any) -> str:
        value = super().validate(obj, value)
        if value not in backend_names():
            raise self.error(obj, value, info=f"one of {', '.join(backend_names())}")
        return str(value)
