"""rigbase benchmarks: `make bench` runs every bench/bench_*.py module and prints figures and ratios."""
