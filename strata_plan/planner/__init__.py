"""Planner: model specs, routing statistics, cost model and placement search."""
