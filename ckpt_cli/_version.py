"""The version of ckpt and where to report a problem, in a module of its own: the library records
the version in what it writes, the app prints both, and neither has to import the public API
package for them. pyproject.toml reads ``__version__`` from here, and its ``Issues`` URL is
``ISSUES`` (tests/packaging/test_metadata.py holds them equal)."""

__version__ = "0.1.0"

#: The issue tracker, named by the one-line message of an internal error (exit 70).
ISSUES = "https://github.com/ckpt-orbax/ckpt-orbax/issues"
