"""What users send: request generators, length distributions, arrival processes."""
