"""Operators: window definitions and assignment, aggregate, join, rules."""
