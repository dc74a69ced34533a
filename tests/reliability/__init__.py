"""Fault injection with real processes, fail-open tiers, breakers, bounded resources, isolation."""
