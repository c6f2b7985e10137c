"""Fitting the simulator to a server (calibrate, live or from runs already made) and testing the fit on unseen load
(validate)."""
