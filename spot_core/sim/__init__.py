"""Simulation: metadata emulator, local spot cloud, trace replay and the policy simulator."""
