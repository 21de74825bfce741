"""``reshard``: rewrite a checkpoint for another device mesh (``plan.plan_reshard``, then
``execute.execute``); ``rules`` maps leaf patterns to partition specs."""
