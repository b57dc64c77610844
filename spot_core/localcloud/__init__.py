"""The local spot cloud: a trace-driven cloud (``cloud``), its HTTP server (``server``)
and client (``client``), and what its nodes run: the instance metadata emulator
(``metadata``: IMDSv2, GCE, Azure shapes) and the lease processes helper
(``lease_processes``). Providers sit above it. The test-only emulators (Kubernetes API,
EC2 instance runtime) are the separate distribution in emulators/ (``spot_emulators``)."""
