"""Prefect flows, deployments, schedules, concurrency limits and run reports."""
