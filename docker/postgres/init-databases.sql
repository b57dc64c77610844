-- Run once by the postgres image on an empty data directory (as POSTGRES_USER): one
-- database for Airflow's metadata and one for the Prefect server.
CREATE DATABASE airflow;
CREATE DATABASE prefect;
