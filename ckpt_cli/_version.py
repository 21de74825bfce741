"""The version of ckpt, in a module of its own: the library records it in what it writes, the
app prints it, and neither has to import the public API package for it."""

__version__ = "0.1.0"
