"""``prune``: retention rules and their reasons (``policy``), a pure plan of what a prune keeps
and removes (``plan``), and its safe execution under the root's lock (``execute``)."""
