"""What the tests, the benchmarks and the Kubernetes demo talk to where nothing real can
run: the Kubernetes API emulator (``kubernetes``), the EC2 instance runtime beside moto
(``ec2_runtime``), the launcher of moto's server (``moto_server``) and the notice-latency
measurement (``notice_latency``).

Not public API, and not in the spot-pipelines wheel: this is the separate distribution
``spot-pipelines-emulators`` (``pip install "spot-pipelines[emulators]"``), built from the
repository's ``emulators/`` folder. The local spot cloud's own parts (the metadata
emulator, the lease processes) are product code in ``spot_core.localcloud``. Containers
run under a real engine (podman) in the tests: there is no Docker emulator."""
