"""hasten's version, declared once: the package face re-exports it and packaging reads it
(pyproject.toml: `version = {attr = "hasten.version.__version__"}`)."""
__version__ = "0.1.0"
