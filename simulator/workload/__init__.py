"""Workloads: synthetic arrivals and lengths, trace readers and the public datasets."""
