"""Providers and regions, and what a region serves: reservations, and the lookups of regional resources."""
