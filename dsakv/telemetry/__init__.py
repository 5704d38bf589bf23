"""Metrics of the cache and the scheduler under vLLM-style names: Prometheus exposition for the engine,
time series for the simulator. No torch here.
"""
