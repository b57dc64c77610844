"""What tests and the local cloud talk to where nothing real runs: the IMDS (metadata)
emulator, the Docker Engine API emulator, the EC2 instance runtime, and the lease
processes helper every emulated node shares."""
