"""Plots, tables and result files shared by the UI, the demo, the CLI and the benchmarks."""
