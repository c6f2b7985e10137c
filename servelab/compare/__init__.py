"""One deployment and one workload simulated on each modelled engine, and why their results differ
(`servelab compare`)."""
