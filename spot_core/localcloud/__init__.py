"""The local spot cloud: a trace-driven cloud (``cloud``), its HTTP server (``server``)
and client (``client``). Providers sit above it; the emulators its nodes use sit below."""
