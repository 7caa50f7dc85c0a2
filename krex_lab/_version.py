"""The package's version: one place, read by the build (pyproject's dynamic version) and by code
that reports it, so that no server module needs the package facade for it."""

__version__ = "0.1.0"
