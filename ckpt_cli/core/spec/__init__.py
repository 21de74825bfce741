"""``spec``: the rule language of ``migrate``, ``export``/``import`` and ``doctor``.

- ``language.py``: a spec file (YAML) parsed and checked: its rules (``Rule``), their ``match:``
  patterns, the initializers they name (``initializers.py``).
- ``ops.py``: the expression of an output leaf over source leaves (``Source``, cast, slice,
  reshape, concat, ...), what writers evaluate block by block.
- ``tree.py``: the working tree a spec transforms (``Work``, ``Step``) and the checks of the
  tree it produces; ``rules.py`` changes it by one rule (the rule engine), ``stack.py`` by the
  stack/unstack rules, ``apply.py`` applies a spec's rules in order (``apply_rules``).
- ``target.py``: a ``--target`` function called on abstract arrays, its leaves compared.

It sits above the read operations (it plans over ``inspect``'s leaves) and below every package
that plans with it: migrate, safetensors, doctor (tests/test_architecture.py).
"""
