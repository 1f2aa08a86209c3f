"""rigbase."""
