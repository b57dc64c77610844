"""Deadline policies: spot, on-demand or wait, so a job of known work ends by its deadline.

- ``base``: the window a policy plans (``Job``, ``Window``), its actions (``IDLE``,
  ``ON_DEMAND``, a zone), the ``DeadlinePolicy`` protocol and the rule-of-thumb policies
  (always on-demand, greedy, Uniform Progress).
- ``mdp``: the project's default, a forecast-driven dynamic programme (``ForecastDP``),
  with its parts ``forecast`` (a semi-Markov model of capacity fitted to the history),
  ``table`` (the plan solved backwards) and ``zones`` (price tiers, the zone to run in).
- ``optimal``: the offline optimum, the bound the benchmark reports against.
- ``policies``: the policies by name (``DEADLINE_POLICIES``, with entry points).
- ``causal``: the window a policy sees, cut at the current tick (a read past it raises).
- ``replay``: real traces of several zones on one clock, cut into windows.
- ``planner``: a live job's window planned once on a trace market (the controller's).
- ``live``: the safety net a live job keeps on any market (on-demand once the work and
  two restarts no longer fit).

Nothing is imported here, so a module of the package costs only what it imports.
"""
