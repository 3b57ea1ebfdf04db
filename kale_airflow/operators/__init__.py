"""Thin Airflow operators: gather inputs, call core, apply outputs."""
