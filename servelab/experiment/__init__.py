"""Running a plan against a target into a results directory; sweeps of such runs."""
