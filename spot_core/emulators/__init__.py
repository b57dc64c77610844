"""What tests and the local cloud talk to where nothing real runs: the IMDS (metadata)
emulator, the EC2 instance runtime, the lease processes helper every emulated node
shares, and the launcher of moto's server (EC2, S3, SQS). Containers run under a real
engine (podman) in the tests: there is no Docker emulator."""
