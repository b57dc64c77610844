"""Lazy cloud SDK imports and error translation: the bottom floor above ``spot_core.errors``.

Everything that talks to a cloud SDK (checkpoint stores, markets, notice detectors,
providers) goes through here, so each SDK stays an optional extra and each SDK error
becomes one of ours in one place. Imports only ``spot_core.errors`` and the stdlib.
"""
