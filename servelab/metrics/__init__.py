"""Records, summary statistics, SLOs, server timelines: shared by every source."""
