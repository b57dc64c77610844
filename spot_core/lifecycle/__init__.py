"""The controller in parts: one attempt lifecycle, and what it delegates.

- ``types``: what drivers exchange with it (``JobSpec``, ``Next``, ``Persist``,
  ``Listener``, ``provider_stores``);
- ``controller``: the ``Controller``, which keeps the lifecycle (advance, check,
  on_lease_end, stop, cancel, adopt, decide, run);
- ``handover``: the replacement launched on a notice (a typed ``Replacement``) and its
  adoption;
- ``liveness``: one live driver per job, and the heartbeats a node's watcher reads;
- ``moves``: mid-run moves (drains), deadline plans and checkpoint intervals;
- ``launching``: the ranked pools tried in order;
- ``closing``: how an attempt's end reads (its outcome, message and lost work).
- ``transition``: what every driver does after each answer (finished, wait N seconds,
  watch; an ended attempt's waiting handover replacement adopted), so drivers keep only
  their own way of waiting.

``spot_core.controller`` re-exports the public names, the import path drivers use.
"""
