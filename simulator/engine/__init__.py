"""The engine: the simpy clock that drives arrivals, scheduler steps and their recording."""
