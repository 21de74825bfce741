"""Text renderers, one per command, over the core's results; ``lines`` and ``units`` are the
shared helpers. Renderers only turn results into text: they never read array data, never
decide, and never build JSON (a result's JSON is its own ``to_json()``)."""
