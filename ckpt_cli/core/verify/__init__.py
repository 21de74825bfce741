"""``verify``: find damage in a root, a step or an item, in levels.

``run.verify_path`` is the entry point; ``targets`` chooses what to check, ``structure`` and
``checks`` (with ``inventory`` and ``ocdbt``) are the structure level, ``deep`` the data levels,
``distributed`` the deep level on an executor's workers; ``problems`` and ``types`` are what it
reports.
"""
