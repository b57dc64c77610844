"""Listener hooks the provider adds to Airflow's (pluggy) listener manager."""
